"""Copying one bookie's share of a closed fragment to a new bookie (BookKeeper's
LedgerFragmentReplicator), and fetching the master key the copies are written with.

Each entry the slot owes is read from the other bookies of its write set (the old bookie last,
when it is still registered: a decommissioned one is a source too), checked against its digest
where the digest needs no password, and written to the new bookie as a RECOVERY_ADD carrying
the ledger's master key, durable before it is acknowledged. ``in_flight`` entries move at once
(pulsar#1981: one entry at a time made 100 GB take hours) and a byte-rate throttle paces them.

An entry no source has -- each answers "no such entry" or "no such ledger", holds a copy that
fails its digest, or is a bookie the auditor already declared lost -- is lost: its range is
reported, never retried (the ledger's other entries are still copied). An entry no source could
be asked about right now (timeouts, a source down but not lost) fails the copy: the worker tries
again later. An entry whose sources answer only EIO besides those definite answers (a copy that
fails the bookie's checksum on disk -- or a disk failing for a moment, which says the same)
fails the copy with ``DamagedCopyError``: the worker tries again a few times, then copies with
``damaged_is_lost`` and the entry is reported lost like one no source has (it was retried
forever, apache/bookkeeper#4872's loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field

from aiobk.autorecovery.explain.model import DAMAGED, ERROR, NO_SOURCE
from aiobk.autorecovery.fragments import FragmentRange, slot_entries
from aiobk.client.digest import Digester
from aiobk.client.entry_read import ask, verified
from aiobk.client.pool import BookiePool
from aiobk.metadata import LedgerMetadata, write_set
from aiobk.protocol import (
    AddFlag,
    AddRequest,
    AddResponse,
    DigestType,
    Durability,
    LedgerKeyRequest,
    LedgerKeyResponse,
    MalformedEntryError,
    StatusCode,
    key_request_proof,
    parse_entry,
)
from aiobk.protocol.errors import BKError, DigestMismatchError

log = logging.getLogger(__name__)

ABSENT = (StatusCode.ENOENTRY, StatusCode.ENOLEDGER)


class CopyError(Exception):
    """The copy could not finish now (a source or the target unreachable): try again later."""

    kind = ERROR  # for operators (``aiobk.autorecovery.explain``)


class NoSourceError(CopyError):
    """No source of some entry could be read now (down, timing out, in limbo)."""

    kind = NO_SOURCE


class DamagedCopyError(CopyError):
    """Every source of some entry answered EIO or a definite "none": its copies are damaged
    (or their disks failing for now)."""

    kind = DAMAGED


@dataclass
class CopyResult:
    entries: int = 0
    bytes: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)  # ascending, merged


class Throttle:
    """At most ``rate`` bytes a second over time (0: no limit), as a debt paid by sleeping:
    a caller that took more than its share waits until the rate catches up."""

    def __init__(self, rate: int, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._clock = clock
        self._free_at = clock()

    def delay(self, size: int) -> float:
        """Seconds to wait before moving ``size`` more bytes (and book them)."""
        if self._rate <= 0:
            return 0.0
        now = self._clock()
        start = max(now, self._free_at)
        self._free_at = start + size / self._rate
        return start - now

    async def take(self, size: int) -> None:
        wait = self.delay(size)
        if wait > 0:
            await asyncio.sleep(wait)


async def fetch_master_key(
    pool: BookiePool,
    bookies: Collection[str],
    ledger_id: int,
    secret: bytes,
    timeout: float,
) -> tuple[bytes | None, bool]:
    """The ledger's master key from the first of ``bookies`` that holds it (LEDGER_KEY, proved
    with the cluster's secret), or None; and whether every one of them answered that it has
    never held the ledger (a definite answer, unlike a timeout or a refusal)."""
    proof = key_request_proof(secret, ledger_id)
    never_held = True
    for bookie in bookies:
        try:
            conn = await pool.get(bookie)
            request = LedgerKeyRequest(conn.next_txn_id(), ledger_id, proof)
            response = await conn.send(request, timeout)
        except BKError:
            never_held = False
            continue
        if not isinstance(response, LedgerKeyResponse):
            never_held = False
        elif response.status is StatusCode.EOK and response.master_key:
            return response.master_key, False
        elif response.status is not StatusCode.ENOLEDGER:
            never_held = False
    return None, never_held


class SlotCopy:
    """One slot of one closed fragment, copied to ``target`` (see the module docstring): every
    entry the slot owes to a new bookie, or (``only``) some entries back onto the slot's own
    bookie, which lacks them (a fill)."""

    def __init__(
        self,
        pool: BookiePool,
        ledger_id: int,
        metadata: LedgerMetadata,
        fragment: FragmentRange,
        slot: int,
        target: str,
        master_key: Callable[[], Awaitable[bytes]],
        *,
        usable: Callable[[str], bool],
        lost_bookies: Collection[str],
        skip: Collection[tuple[int, int]] = (),
        only: Collection[int] | None = None,
        timeout: float,
        in_flight: int,
        throttle: Throttle,
        damaged_is_lost: bool = False,
        on_copied: Callable[[int], None] | None = None,
    ) -> None:
        self._pool = pool
        self._on_copied = on_copied  # told each entry's size once it is written
        self._ledger_id = ledger_id
        self._metadata = metadata
        self._fragment = fragment
        self._slot = slot
        self._target = target
        self._key = master_key  # asked once there is something to write (a lost ledger
        # whose only holder is gone has no key left anywhere, and needs none)
        self._usable = usable  # registered: worth asking
        self._lost = set(lost_bookies)  # declared lost: their silence is an answer
        self._skip = sorted(skip)  # ranges already known lost
        self._only = None if only is None else sorted(only)  # a fill: just these entries
        self._timeout = timeout
        self._in_flight = in_flight
        self._throttle = throttle
        self._damaged_is_lost = damaged_is_lost  # EIO from a source: a copy it does not have
        self._digest = (
            Digester(metadata.digest_type) if metadata.digest_type is not DigestType.MAC else None
        )
        self.result = CopyResult()
        self._lost_entries: list[int] = []

    def _entries(self) -> Iterator[int]:
        metadata, fragment = self._metadata, self._fragment
        e, wq = metadata.ensemble_size, metadata.write_quorum
        owed: Iterable[int] = (
            slot_entries(fragment.first, fragment.last, self._slot, e, wq)
            if self._only is None
            else self._only
        )
        for entry in owed:
            if not any(low <= entry <= high for low, high in self._skip):
                yield entry

    def _sources(self, entry_id: int) -> list[str]:
        metadata, fragment = self._metadata, self._fragment
        slots = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
        others = [fragment.ensemble[s] for s in slots if s != self._slot]
        old = fragment.ensemble[self._slot]
        ordered = [b for b in others if self._usable(b)] + [
            b for b in others if not self._usable(b)
        ]
        if self._usable(old):
            ordered.append(old)
        return [b for b in ordered if b != self._target]

    async def run(self) -> CopyResult:
        entries = self._entries()
        failure: list[BaseException] = []

        async def worker() -> None:
            for entry_id in entries:
                if failure:
                    return
                try:
                    await self._copy(entry_id)
                except Exception as exc:  # any failure stops every copier after its entry
                    failure.append(exc)
                    return

        await asyncio.gather(*(worker() for _ in range(self._in_flight)))
        if failure:
            raise failure[0]
        self.result.lost = _ranges(sorted(self._lost_entries))
        return self.result

    async def _copy(self, entry_id: int) -> None:
        body = await self._read(entry_id)
        if body is None:
            self._lost_entries.append(entry_id)
            return
        await self._throttle.take(len(body))
        key = await self._key()
        try:
            conn = await self._pool.get(self._target)
            request = AddRequest(
                conn.next_txn_id(), self._ledger_id, entry_id, AddFlag.RECOVERY_ADD,
                Durability.PERSISTENT, key, body,
            )  # fmt: skip
            response = await conn.send(request, self._timeout)
        except BKError as exc:
            raise CopyError(f"writing entry {entry_id} to {self._target}: {exc}") from exc
        if not isinstance(response, AddResponse) or response.status is not StatusCode.EOK:
            raise CopyError(f"{self._target} refused entry {entry_id}: {response.status.name}")
        self.result.entries += 1
        self.result.bytes += len(body)
        if self._on_copied is not None:
            self._on_copied(len(body))

    async def _read(self, entry_id: int) -> bytes | None:
        """The entry's stored bytes from some source; None when every source is sure it has
        none (lost); CopyError when some could not be asked; DamagedCopyError when the others
        answered EIO (unless ``damaged_is_lost``)."""
        unsure = damaged = False
        for bookie in self._sources(entry_id):
            if not self._usable(bookie):
                unsure |= bookie not in self._lost
                continue
            try:
                response = await ask(self._pool, bookie, self._ledger_id, entry_id, self._timeout)
            except BKError:
                unsure = True
                continue
            body = response.body
            if response.status is StatusCode.EOK and body is not None:
                if self._good(body, entry_id, bookie):
                    return body
                continue  # a damaged copy: another source, and it counts as none
            if response.status is StatusCode.EIO:
                damaged = True  # damaged on its disk, or the disk failing for a moment
            elif response.status not in ABSENT:
                unsure = True  # limbo, a refusal: the copy may be there
        if unsure:
            raise NoSourceError(f"entry {entry_id}: no source could be read now")
        if damaged and not self._damaged_is_lost:
            raise DamagedCopyError(f"entry {entry_id}: every copy read is damaged (EIO)")
        return None

    def _good(self, body: bytes, entry_id: int, bookie: str) -> bool:
        try:
            if self._digest is not None:
                verified(body, self._digest, self._ledger_id, entry_id, bookie)
            else:  # a MAC needs the password: check what can be checked without it
                parsed = parse_entry(body)
                if (parsed.ledger_id, parsed.entry_id) != (self._ledger_id, entry_id):
                    return False
        except (DigestMismatchError, MalformedEntryError):
            log.warning(
                "ledger %d entry %d: a damaged copy on %s, not copied",
                self._ledger_id, entry_id, bookie,
            )  # fmt: skip
            return False
        return True


def _ranges(entries: list[int]) -> list[tuple[int, int]]:
    """Ascending entry ids as inclusive ranges, consecutive ids merged."""
    out: list[tuple[int, int]] = []
    for entry in entries:
        if out and out[-1][1] + 1 == entry:
            out[-1] = (out[-1][0], entry)
        else:
            out.append((entry, entry))
    return out


__all__ = [
    "CopyError",
    "CopyResult",
    "DamagedCopyError",
    "NoSourceError",
    "SlotCopy",
    "Throttle",
    "fetch_master_key",
]
