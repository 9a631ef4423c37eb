"""What autorecovery keeps in the metadata store (after BookKeeper's
LedgerUnderreplicationManager and AuditorElector, which its own etcd driver does not implement).

Keys under ``PREFIX/autorecovery/`` (``KeyLayout``)::

    auditor                     the elected auditor's id, under its lease
    status                      what the auditor last saw (``AuditorStatus``), under its lease
    disabled                    present while an operator has autorecovery disabled
    audit                       written to ask the auditor for a full check now
    audit-served                the newest such request a full check answered
    secret                      the cluster's key-request secret (``cluster_secret``)
    underreplicated/LEDGER      an ``UnderReplication`` mark
    claims/LEDGER               the worker repairing that ledger now, under its lease
    attempts/LEDGER             that worker's last attempt at it (``RepairAttempt``): what it
                                is doing, or why it stopped and when it tries again; under
                                its lease (its backoff dies with it)
    decommission/BOOKIE         a bookie being drained: workers move its copies away

Theory of operation. The auditor marks a ledger when a bookie named in it is lost, or a check
finds copies missing, or a write set spans too few racks (``PLACEMENT``: the
mark names no bookie); a worker claims one marked ledger at a time, repairs it, and removes the
mark -- with a compare-and-set on the version it read, so a mark the auditor widened meanwhile
survives for another pass. Claims only keep workers out of each other's way: a worker whose
lease lapsed may still be running, so every change it makes to a ledger is a compare-and-set on
the ledger's version (``metadata.lease``). A mark records entry ranges found with no copy left
(``lost``): such a ledger is reported, not retried.

Autorecovery's settings (``AutoRecoveryConfig``, in ``aiobk.metadata.autorecovery_config``)
live in this layer too, the lowest that both ``aiobk.autorecovery`` and the bookie's config
import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from aiobk.metadata.autorecovery_config import AutoRecoveryConfig
from aiobk.metadata.keys import KeyLayout
from aiobk.metadata.kv import KV, KeyExistsError, KeyMissingError, RevisionMismatchError
from aiobk.metadata.listing import walk_ids
from aiobk.metadata.model import MetadataFormatError
from aiobk.protocol.errors import MetadataVersionError

FORMAT = 1
SECRET_SIZE = 32

# Why a ledger was marked (BookKeeper's auditor tasks).
LOST_BOOKIE = "lost-bookie"  # a bookie named in an ensemble is gone for good
CHECK = "check"  # a periodic check found a copy missing
DECOMMISSION = "decommission"  # an operator drains a bookie
# A write set spans fewer racks than the cluster allows (``min_racks_per_write_quorum``): no
# copy is missing, so the mark names no bookie. A release whose workers take only marks naming
# bookies passes such a mark by, as it does a report of lost entries.
PLACEMENT = "placement"


def _dump(document: dict[str, Any]) -> bytes:
    return json.dumps(
        {"format": FORMAT, **document}, separators=(",", ":"), sort_keys=True
    ).encode()


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise MetadataFormatError(f"{what} is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise MetadataFormatError(f"{what}: not a format-{FORMAT} JSON object")
    return document


@dataclass(frozen=True, slots=True)
class UnderReplication:
    """A ledger with copies missing (or about to go: a decommissioned bookie's)."""

    ledger_id: int
    missing: tuple[str, ...]  # bookies whose copies are, or may be, missing; sorted
    since: int  # milliseconds (the marker's wall clock) when first marked
    reasons: tuple[str, ...] = ()  # LOST_BOOKIE, CHECK, DECOMMISSION, PLACEMENT; sorted
    lost: tuple[tuple[int, int], ...] = ()  # entry ranges with no copy anywhere: not retried
    version: int = field(default=-1, compare=False)

    def to_json(self) -> bytes:
        return _dump(
            {
                "ledger_id": self.ledger_id,
                "missing": list(self.missing),
                "since": self.since,
                "reasons": list(self.reasons),
                "lost": [list(r) for r in self.lost],
            }
        )

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> UnderReplication:
        d = _load(data, "under-replication mark")
        try:
            lost = tuple((int(a), int(b)) for a, b in d.get("lost", ()))
            return cls(
                int(d["ledger_id"]),
                tuple(str(b) for b in d["missing"]),
                int(d["since"]),
                tuple(str(r) for r in d.get("reasons", ())),
                lost,
                version,
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise MetadataFormatError(f"unreadable under-replication mark: {exc!r}") from None

    def widened(self, missing: Iterable[str], reason: str) -> UnderReplication:
        return UnderReplication(
            self.ledger_id,
            tuple(sorted({*self.missing, *missing})),
            self.since,
            tuple(sorted({*self.reasons, reason})),
            self.lost,
            self.version,
        )

    def without(self, bookies: Iterable[str]) -> UnderReplication:
        gone = set(bookies)
        return UnderReplication(
            self.ledger_id,
            tuple(b for b in self.missing if b not in gone),
            self.since,
            self.reasons,
            self.lost,
            self.version,
        )

    def with_lost(self, lost: Iterable[tuple[int, int]]) -> UnderReplication:
        return UnderReplication(
            self.ledger_id,
            self.missing,
            self.since,
            self.reasons,
            tuple(sorted({*self.lost, *lost})),
            self.version,
        )


@dataclass(frozen=True, slots=True)
class AuditorStatus:
    """What the auditor publishes for ``aiobk autorecovery status``."""

    auditor: str
    lost_bookies: dict[str, int] = field(default_factory=dict)  # id -> ms when last seen
    missing_bookies: dict[str, int] = field(default_factory=dict)  # gone, not yet lost
    last_check: int = 0  # ms of the last full check's end (0: none yet)
    last_bookie_check: int = 0  # ms of the last lost-bookie check's end
    # The auditor's autorecovery settings (delays, grace period, throttle), so that an
    # explanation read from the store alone can say when a wait ends.
    settings: dict[str, float] = field(default_factory=dict)
    version: int = field(default=-1, compare=False)

    def to_json(self) -> bytes:
        return _dump(
            {
                "auditor": self.auditor,
                "lost_bookies": self.lost_bookies,
                "missing_bookies": self.missing_bookies,
                "last_check": self.last_check,
                "last_bookie_check": self.last_bookie_check,
                "settings": self.settings,
            }
        )

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> AuditorStatus:
        d = _load(data, "auditor status")
        try:
            return cls(
                str(d["auditor"]),
                {str(k): int(v) for k, v in d.get("lost_bookies", {}).items()},
                {str(k): int(v) for k, v in d.get("missing_bookies", {}).items()},
                int(d.get("last_check", 0)),
                int(d.get("last_bookie_check", 0)),
                {str(k): float(v) for k, v in d.get("settings", {}).items()},
                version,
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise MetadataFormatError(f"unreadable auditor status: {exc!r}") from None


# RepairAttempt.state
REPAIRING = "repairing"  # claimed and being worked on now
FAILED = "failed"  # stopped: tried again at ``retry_at`` (backing off)
DEFERRED = "deferred"  # not now (a grace period, a race): tried again at ``retry_at``


@dataclass(frozen=True, slots=True)
class RepairAttempt:
    """A worker's latest attempt at one ledger, as operators see it (``aiobk autorecovery
    explain``): written when it claims the ledger, while it copies, and when it stops short;
    removed once the ledger is repaired. ``kind`` names why it stopped (``aiobk.autorecovery.
    explain`` has the list); ``detail`` says it in words."""

    ledger_id: int
    worker: str
    started: int  # ms when the worker took the ledger for this attempt
    state: str = REPAIRING
    kind: str = ""
    detail: str = ""
    failures: int = 0  # attempts in a row that failed, this one included once it has
    retry_at: int = 0  # ms before which this worker will not take it again (0: any time)
    updated: int = 0  # ms of this record
    entries_to_copy: int = 0  # what this attempt found to copy, once it knows
    entries_copied: int = 0
    bytes_copied: int = 0
    max_bytes_per_second: int = 0  # the worker's copying throttle (0: none)
    version: int = field(default=-1, compare=False)

    def to_json(self) -> bytes:
        return _dump({f.name: getattr(self, f.name) for f in fields(self) if f.name != "version"})

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> RepairAttempt:
        d = _load(data, "repair attempt")
        try:
            values: dict[str, Any] = {}
            for f in fields(cls):
                if f.name == "version" or f.name not in d:
                    continue
                kind = str if f.type == "str" else int
                values[f.name] = kind(d[f.name])
            return cls(**values, version=version)
        except (KeyError, ValueError, TypeError) as exc:
            raise MetadataFormatError(f"unreadable repair attempt: {exc!r}") from None


class AutoRecoveryStore:
    """Autorecovery's keys over the store's ``KV`` (``MetadataStore.autorecovery``)."""

    def __init__(self, kv: KV, keys: KeyLayout) -> None:
        self._kv = kv
        self._keys = keys

    # ------------------------------------------------------------------ marks

    async def mark(
        self, ledger_id: int, missing: Iterable[str], reason: str, now_ms: int
    ) -> UnderReplication:
        """Mark the ledger under-replicated, or widen its mark (compare-and-set until it
        lands): the bookies in ``missing`` join those already named."""
        key = self._keys.underreplicated(ledger_id)
        wanted = tuple(sorted(set(missing)))
        for _attempt in range(50):
            found, _rev = await self._kv.get(key)
            try:
                if found is None:
                    fresh = UnderReplication(ledger_id, wanted, now_ms, (reason,))
                    return _versioned(fresh, await self._kv.create(key, fresh.to_json()))
                current = UnderReplication.from_json(found.value, found.mod_revision)
                wider = current.widened(wanted, reason)
                if wider == current:
                    return current
                revision = await self._kv.compare_and_set(key, wider.to_json(), found.mod_revision)
                return _versioned(wider, revision)
            except (KeyExistsError, KeyMissingError, RevisionMismatchError):
                continue
        raise MetadataVersionError(f"mark of ledger {ledger_id}: still racing")

    async def read_mark(self, ledger_id: int) -> UnderReplication | None:
        found, _rev = await self._kv.get(self._keys.underreplicated(ledger_id))
        if found is None:
            return None
        return UnderReplication.from_json(found.value, found.mod_revision)

    async def write_mark(self, mark: UnderReplication) -> UnderReplication:
        """Replace the mark if it is still at ``mark.version``; MetadataVersionError if not."""
        key = self._keys.underreplicated(mark.ledger_id)
        try:
            revision = await self._kv.compare_and_set(key, mark.to_json(), mark.version)
        except (KeyMissingError, RevisionMismatchError) as exc:
            raise MetadataVersionError(f"mark of ledger {mark.ledger_id} changed: {exc}") from None
        return _versioned(mark, revision)

    async def unmark(self, mark: UnderReplication) -> None:
        """Remove the mark if it is still at ``mark.version`` (MetadataVersionError if it
        changed: somebody widened it, so it still needs work)."""
        try:
            await self._kv.delete(self._keys.underreplicated(mark.ledger_id), mark.version)
        except KeyMissingError:
            return
        except RevisionMismatchError as exc:
            raise MetadataVersionError(f"mark of ledger {mark.ledger_id} changed: {exc}") from None

    async def marks(
        self, page_size: int = 500, after_ledger: int | None = None
    ) -> AsyncGenerator[UnderReplication, None]:
        """Every mark in ledger id order (those after ``after_ledger``), a page at a time,
        through windows of ids (``metadata.listing``: etcd counts a limited range to its end,
        so paging by limit alone counted every mark left for every page)."""
        keys = self._keys
        walk = walk_ids(
            self._kv,
            keys.underreplicated_prefix,
            keys.underreplicated,
            page_size,
            keys_only=False,
            after=after_ledger,
        )
        async with contextlib.aclosing(walk) as items:  # workers stop at the first mark free
            async for item in items:
                try:
                    yield UnderReplication.from_json(item.value, item.mod_revision)
                except MetadataFormatError:
                    continue  # a damaged mark is not work anyone can do; skipped

    async def marked_ids(self, page_size: int = 1000) -> AsyncIterator[int]:
        """The marked ledgers' ids (keys only), in order, as ``marks`` walks them."""
        prefix = self._keys.underreplicated_prefix
        walk = walk_ids(self._kv, prefix, self._keys.underreplicated, page_size, keys_only=True)
        async with contextlib.aclosing(walk) as items:
            async for item in items:
                yield self._keys.ledger_id_of(prefix, item.key)

    # ------------------------------------------------------------------ claims

    async def claim(self, ledger_id: int, owner: str, lease: int) -> int | None:
        """Take the ledger for repair under ``lease``: the claim's version, or None when
        another worker holds it."""
        try:
            return await self._kv.create(self._keys.claim(ledger_id), owner.encode(), lease)
        except KeyExistsError:
            return None

    async def release(self, ledger_id: int, version: int) -> None:
        """Give the claim back (if it is still the one taken at ``version``)."""
        with contextlib.suppress(KeyMissingError, RevisionMismatchError):
            await self._kv.delete(self._keys.claim(ledger_id), version)

    async def claimant(self, ledger_id: int) -> str | None:
        found, _rev = await self._kv.get(self._keys.claim(ledger_id))
        return None if found is None else found.value.decode(errors="replace")

    # ------------------------------------------------------------------ attempts

    async def note_attempt(self, attempt: RepairAttempt, lease: int) -> None:
        """Write the worker's attempt under its lease, over whatever attempt was there (the
        latest worker to try a ledger is the one to hear about). An attempt under way that has
        no reason of its own keeps the reason the one before it stopped for."""
        key = self._keys.attempt(attempt.ledger_id)
        for _try in range(5):
            found, _rev = await self._kv.get(key)
            if found is not None and attempt.state == REPAIRING and not attempt.kind:
                with contextlib.suppress(MetadataFormatError):
                    before = RepairAttempt.from_json(found.value)
                    attempt = dataclasses.replace(attempt, kind=before.kind, detail=before.detail)
            try:
                if found is None:
                    await self._kv.create(key, attempt.to_json(), lease)
                else:
                    await self._kv.compare_and_set(
                        key, attempt.to_json(), found.mod_revision, lease
                    )
                return
            except (KeyExistsError, KeyMissingError, RevisionMismatchError):
                continue

    async def read_attempt(self, ledger_id: int) -> RepairAttempt | None:
        found, _rev = await self._kv.get(self._keys.attempt(ledger_id))
        if found is None:
            return None
        try:
            return RepairAttempt.from_json(found.value, found.mod_revision)
        except MetadataFormatError:
            return None  # a damaged note explains nothing

    async def clear_attempt(self, ledger_id: int) -> None:
        """Remove the ledger's attempt, whoever wrote it (the ledger is repaired); a read
        only when there is none."""
        key = self._keys.attempt(ledger_id)
        found, _rev = await self._kv.get(key)
        if found is not None:
            with contextlib.suppress(KeyMissingError, RevisionMismatchError):
                await self._kv.delete(key, found.mod_revision)

    # ------------------------------------------------------------------ the auditor

    async def elect(self, candidate: str, lease: int) -> bool:
        """Become the auditor if there is none (the key lives as long as ``lease``)."""
        try:
            await self._kv.create(self._keys.auditor, candidate.encode(), lease)
        except KeyExistsError:
            return False
        return True

    async def auditor(self) -> str | None:
        found, _rev = await self._kv.get(self._keys.auditor)
        return None if found is None else found.value.decode(errors="replace")

    async def publish_status(self, status: AuditorStatus, lease: int) -> AuditorStatus:
        """Write the auditor's status under its lease (unconditionally: one auditor writes)."""
        key = self._keys.autorecovery_status
        found, _rev = await self._kv.get(key)
        try:
            if found is None:
                revision = await self._kv.create(key, status.to_json(), lease)
            else:
                revision = await self._kv.compare_and_set(
                    key, status.to_json(), found.mod_revision, lease
                )
        except (KeyExistsError, KeyMissingError, RevisionMismatchError) as exc:
            raise MetadataVersionError(f"auditor status changed under its writer: {exc}") from None
        return _versioned(status, revision)

    async def read_status(self) -> AuditorStatus | None:
        found, _rev = await self._kv.get(self._keys.autorecovery_status)
        if found is None:
            return None
        return AuditorStatus.from_json(found.value, found.mod_revision)

    async def request_audit(self) -> int:
        """Ask the auditor for a full check now; the request's revision."""
        return await self._kv.bump(self._keys.audit_request)

    async def audit_requested(self) -> int:
        """The revision of the newest audit request (0: never asked)."""
        found, _rev = await self._kv.get(self._keys.audit_request)
        return 0 if found is None else found.mod_revision

    async def audit_served(self) -> int:
        """The newest audit request a full check answered (0: none): an auditor elected after
        a request its predecessor never served serves it (requests are not lost to a
        failover)."""
        found, _rev = await self._kv.get(self._keys.audit_served)
        return 0 if found is None else int(found.value)

    async def serve_audit(self, request: int) -> None:
        """Record that a full check answered every request up to ``request``."""
        key = self._keys.audit_served
        for _attempt in range(50):
            found, _rev = await self._kv.get(key)
            if found is not None and int(found.value) >= request:
                return
            try:
                if found is None:
                    await self._kv.create(key, str(request).encode())
                else:
                    await self._kv.compare_and_set(key, str(request).encode(), found.mod_revision)
                return
            except (KeyExistsError, KeyMissingError, RevisionMismatchError):
                continue

    # ------------------------------------------------------------------ decommissioning

    async def decommissioning(self) -> set[str]:
        """Bookies an operator is draining (``aiobk bookies decommission``)."""
        prefix = self._keys.decommission_prefix
        page, _rev = await self._kv.range(prefix, None, 10_000, keys_only=True)
        return {item.key[len(prefix) :].decode(errors="replace") for item in page}

    async def set_decommissioning(self, bookie_id: str, draining: bool) -> None:
        key = self._keys.decommission(bookie_id)
        try:
            if draining:
                await self._kv.create(key, b"")
            else:
                await self._kv.delete(key)
        except (KeyExistsError, KeyMissingError):
            pass

    # ------------------------------------------------------------------ switch, secret

    async def enabled(self) -> bool:
        found, _rev = await self._kv.get(self._keys.autorecovery_disabled)
        return found is None

    async def set_enabled(self, enabled: bool) -> None:
        key = self._keys.autorecovery_disabled
        try:
            if enabled:
                await self._kv.delete(key)
            else:
                await self._kv.create(key, b"disabled by an operator")
        except (KeyExistsError, KeyMissingError):
            pass

    async def cluster_secret(self, make: Callable[[int], bytes] | None = None) -> bytes | None:
        """The secret a replication worker proves it knows when it asks a bookie for a
        ledger's master key (``protocol.key_request_proof``): made once by the first worker
        that needs it (``make(n)``: n unpredictable bytes), read by everyone else (None while
        nobody has made it). Anyone who can read the store can read it -- and could rewrite
        any ledger's metadata anyway; a peer that only reaches the bookie port cannot."""
        key = self._keys.cluster_secret
        found, _rev = await self._kv.get(key)
        if found is None and make is not None:
            with contextlib.suppress(KeyExistsError):
                await self._kv.create(key, make(SECRET_SIZE))
            found, _rev = await self._kv.get(key)
        return None if found is None else found.value


Versioned = TypeVar("Versioned", UnderReplication, AuditorStatus)


def _versioned(record: Versioned, version: int) -> Versioned:
    return dataclasses.replace(record, version=version)


__all__ = [
    "CHECK",
    "DECOMMISSION",
    "DEFERRED",
    "FAILED",
    "LOST_BOOKIE",
    "PLACEMENT",
    "REPAIRING",
    "AuditorStatus",
    "AutoRecoveryConfig",
    "AutoRecoveryStore",
    "RepairAttempt",
    "UnderReplication",
]
