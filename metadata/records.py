"""The other values the metadata store keeps: the cluster record, bookie registrations, cookies,
log records (with a log's offload policy), the cluster's offload store.

All JSON with a ``format`` number, all immutable, each carrying the store version it was read
at (``version``, not serialized).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiobk.metadata.model import MetadataFormatError

FORMAT = 1


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise MetadataFormatError(f"{what} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MetadataFormatError(f"{what} is not a JSON object")
    if document.get("format") != FORMAT:
        raise MetadataFormatError(f"{what} format {document.get('format')!r} is not supported")
    return document


def _dump(document: dict[str, Any]) -> bytes:
    return json.dumps(
        {"format": FORMAT, **document}, separators=(",", ":"), sort_keys=True
    ).encode()


WRITABLE = "writable"
READ_ONLY = "readonly"

# A bookie's failure domain, "/ZONE/RACK" (docs/design/placement.md): bookies that one fault
# (a switch, a power feed, a cloud zone) can take down together share a rack; racks that one
# larger fault can take down share a zone.
DEFAULT_RACK = "/default-zone/default-rack"


def check_rack(rack: str) -> str:
    """``rack`` when it names a failure domain, ``/ZONE/RACK`` or ``/RACK`` (a rack in the
    default zone); ValueError naming the form otherwise."""
    parts = rack.split("/")
    if (
        len(parts) not in (2, 3)
        or parts[0]
        or not all(parts[1:])
        or any(c.isspace() or not c.isprintable() for c in rack)
    ):
        raise ValueError(f"rack {rack!r}: expected /ZONE/RACK (or /RACK), without spaces")
    return rack


def zone_of(rack: str) -> str:
    """The zone a rack is in: ``/ZONE`` of ``/ZONE/RACK``; a ``/RACK`` is in the default zone."""
    parts = rack.split("/")
    return f"/{parts[1]}" if len(parts) == 3 else "/default-zone"


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """What marks a prefix as holding a cluster, as BookKeeper's INSTANCEID does: written once,
    when the cluster is set up (its first bookie boots), and never changed; ``instance_id``
    tells one cluster from another. Fields this version does not know are kept as read."""

    instance_id: str
    version: int = field(default=-1, compare=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> bytes:
        return _dump({**self.extra, "instance_id": self.instance_id})

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> ClusterRecord:
        d = _load(data, "cluster record")
        instance_id = d.get("instance_id")
        if not isinstance(instance_id, str) or not instance_id:
            raise MetadataFormatError("unreadable cluster record: no instance id")
        extra = {k: v for k, v in d.items() if k not in ("format", "instance_id")}
        return cls(instance_id, version, extra)


@dataclass(frozen=True, slots=True)
class BookieServiceInfo:
    """What a live bookie publishes under its lease."""

    bookie_id: str
    address: str  # host:port to connect to
    state: str = WRITABLE  # WRITABLE or READ_ONLY
    software_version: str = ""
    free_bytes: int = 0
    total_bytes: int = 0
    instance_id: str = ""  # identity of the bookie's data directories (a restart keeps it)
    version: int = field(default=-1, compare=False)
    rack: str = DEFAULT_RACK  # its failure domain (check_rack)

    @property
    def writable(self) -> bool:
        return self.state == WRITABLE

    def to_json(self) -> bytes:
        return _dump(
            {
                "bookie_id": self.bookie_id,
                "address": self.address,
                "state": self.state,
                "software_version": self.software_version,
                "free_bytes": self.free_bytes,
                "total_bytes": self.total_bytes,
                "instance_id": self.instance_id,
                "rack": self.rack,
            }
        )

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> BookieServiceInfo:
        d = _load(data, "bookie registration")
        try:
            state = str(d["state"])
            if state not in (WRITABLE, READ_ONLY):
                raise ValueError(f"unknown bookie state {state!r}")
            return cls(
                str(d["bookie_id"]),
                str(d["address"]),
                state,
                str(d.get("software_version", "")),
                int(d.get("free_bytes", 0)),
                int(d.get("total_bytes", 0)),
                str(d.get("instance_id", "")),
                version,
                check_rack(str(d.get("rack", DEFAULT_RACK))),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise MetadataFormatError(f"unreadable bookie registration: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class Cookie:
    """A bookie's identity (BP-46 "A note on cookies"): address, directories, instance id."""

    bookie_id: str
    address: str
    journal_dirs: tuple[str, ...]
    data_dirs: tuple[str, ...]
    instance_id: str
    version: int = field(default=-1, compare=False)

    def to_json(self) -> bytes:
        return _dump(
            {
                "bookie_id": self.bookie_id,
                "address": self.address,
                "journal_dirs": list(self.journal_dirs),
                "data_dirs": list(self.data_dirs),
                "instance_id": self.instance_id,
            }
        )

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> Cookie:
        d = _load(data, "cookie")
        try:
            return cls(
                str(d["bookie_id"]),
                str(d["address"]),
                tuple(str(x) for x in d["journal_dirs"]),
                tuple(str(x) for x in d["data_dirs"]),
                str(d["instance_id"]),
                version,
            )
        except (KeyError, TypeError) as exc:
            raise MetadataFormatError(f"unreadable cookie: {exc!r}") from None

    def differences(self, other: Cookie) -> list[str]:
        """Human-readable fields that differ (for boot refusal messages)."""
        out = []
        for name in ("bookie_id", "address", "journal_dirs", "data_dirs", "instance_id"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                out.append(f"{name}: {mine!r} != {theirs!r}")
        return out


@dataclass(frozen=True, slots=True)
class ProducerState:
    """What a log knows of its producers (idempotent writers, docs/design/logs.md): each
    producer's last sequence number durably in the log, and when it was last seen (milliseconds
    since the epoch, by the clock of the writers that held the log), for every record in the
    log's ledgers before ledger ``as_of``. A writer taking the log learns the rest from the last
    entry of each producer's ledger from ``as_of`` on, so what it reads is bounded whatever the
    log's length; every roll moves ``as_of`` to the new ledger."""

    as_of: int
    last: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # id: (sequence, seen)

    def to_dict(self) -> dict[str, Any]:
        return {"as_of": self.as_of, "last": {p: list(v) for p, v in self.last.items()}}

    @classmethod
    def from_dict(cls, d: Any) -> ProducerState:
        if not isinstance(d, dict) or not isinstance(d.get("last"), dict):
            raise TypeError("producers must be an object with 'as_of' and 'last'")
        as_of = d.get("as_of")
        if not isinstance(as_of, int) or isinstance(as_of, bool):
            raise TypeError("producers.as_of must be a ledger id")
        last: dict[str, tuple[int, int]] = {}
        for producer, value in d["last"].items():
            if (
                not isinstance(value, list)
                or len(value) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in value)
            ):
                raise TypeError(f"producer {producer!r}: [sequence, seen] expected")
            last[producer] = (value[0], value[1])
        return cls(as_of, last)


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{what} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return float(value)


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class OffloadPolicy:
    """Which closed ledgers of a log are copied to the cluster's object store
    (``LogMetadata.offload_policy``): those whose next ledger was created more than
    ``older_than`` seconds ago (the roll that closed them), and those beyond the newest
    ``beyond_bytes`` of the log, counting ledgers' lengths from its tail. None: that rule is
    off. Never the log's open ledger, nor one already offloaded."""

    older_than: float | None = None
    beyond_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.older_than is not None:
            _number(self.older_than, "offload_policy.older_than")
        if self.beyond_bytes is not None:
            _count(self.beyond_bytes, "offload_policy.beyond_bytes")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the rules that are on."""
        document: dict[str, Any] = {}
        if self.older_than is not None:
            document["older_than"] = self.older_than
        if self.beyond_bytes is not None:
            document["beyond_bytes"] = self.beyond_bytes
        return document

    @classmethod
    def from_dict(cls, document: object) -> OffloadPolicy:
        """The policy of a JSON object; TypeError or ValueError naming what is wrong."""
        if not isinstance(document, dict):
            raise TypeError(f"offload_policy must be an object, got {document!r}")
        older_than = document.get("older_than")
        beyond_bytes = document.get("beyond_bytes")
        return cls(
            None if older_than is None else _number(older_than, "offload_policy.older_than"),
            None if beyond_bytes is None else _count(beyond_bytes, "offload_policy.beyond_bytes"),
        )


@dataclass(frozen=True, slots=True)
class LogMetadata:
    """A named log: its ledgers in order (docs/design/logs.md), how its entries hold its
    records (``record_format``: ``"raw"``, what a record without the field means, or
    ``"envelope"``; ``aiobk.client.log.format`` defines both), and which writer holds it.

    ``writer`` names the writer that holds the log by the id of the ledger it took the log
    with: taking a log (a log writer opening, the Spark sink committing) sets it in the same
    compare-and-set that adds that ledger. Every other change -- a roll, a truncation, a
    retention pass -- keeps it, so a writer that finds the record changed under it tells a
    takeover (another writer's ledger) from routine maintenance (its own) by this field alone.
    Ledger ids are never reused, so a writer can never find its own name again after a
    takeover, whatever happened between. -1: no writer recorded.

    Fields this version does not know (``extra``) are kept as read and written back with every
    change, so a newer version's additions survive an older client's truncation. Fields are
    stored only when not at their defaults, so older code reads such records."""

    name: str
    ledgers: tuple[int, ...] = ()
    version: int = field(default=-1, compare=False)
    record_format: str = "raw"
    writer: int = -1
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    producers: ProducerState | None = None  # None: no producer has written to the log
    offload_policy: OffloadPolicy | None = None  # None: the log's ledgers are not offloaded

    def to_json(self) -> bytes:
        fields: dict[str, Any] = {**self.extra, "name": self.name, "ledgers": list(self.ledgers)}
        if self.record_format != "raw":
            fields["record_format"] = self.record_format
        if self.writer >= 0:
            fields["writer"] = self.writer
        if self.producers is not None:
            fields["producers"] = self.producers.to_dict()
        if self.offload_policy is not None:
            fields["offload_policy"] = self.offload_policy.to_dict()
        return _dump(fields)

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> LogMetadata:
        d = _load(data, "log record")
        try:
            ledgers = tuple(d["ledgers"])
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in ledgers):
                raise TypeError("ledger ids must be integers")
            record_format = d.get("record_format", "raw")
            if not isinstance(record_format, str):
                raise TypeError("the record format must be a string")
            writer = d.get("writer", -1)
            if not isinstance(writer, int) or isinstance(writer, bool):
                raise TypeError("the writer must be a ledger id")
            producers = d.get("producers")
            if producers is not None:
                producers = ProducerState.from_dict(producers)
            policy = d.get("offload_policy")
            if policy is not None:
                policy = OffloadPolicy.from_dict(policy)
            extra = {k: v for k, v in d.items() if k not in _LOG_FIELDS}
            return cls(
                str(d["name"]), ledgers, version, record_format, writer, extra, producers, policy
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MetadataFormatError(f"unreadable log record: {exc!r}") from None

    def with_ledgers(self, ledgers: tuple[int, ...]) -> LogMetadata:
        """The same log, writer and version with another ledger list (a roll, a truncation)."""
        return dataclasses.replace(self, ledgers=ledgers)

    def taken(
        self, ledgers: tuple[int, ...], writer: int, producers: ProducerState | None = None
    ) -> LogMetadata:
        """The log taken by a new writer, named by the ledger ``writer`` it takes it with; with
        ``producers``, what the writer learnt of them (else they are kept as they are)."""
        return dataclasses.replace(
            self, ledgers=ledgers, writer=writer, producers=producers or self.producers
        )

    def with_producers(self, producers: ProducerState | None) -> LogMetadata:
        """The same log with what is known of its producers replaced (a roll)."""
        return dataclasses.replace(self, producers=producers)

    def with_offload_policy(self, policy: OffloadPolicy | None) -> LogMetadata:
        """The same log with its offload policy replaced (None: its ledgers stay on bookies)."""
        return dataclasses.replace(self, offload_policy=policy)


_LOG_FIELDS = frozenset({
    "format", "name", "ledgers", "record_format", "writer", "producers", "offload_policy",
})  # fmt: skip

# Pulsar's managedLedgerOffloadDeletionLagMs, "(default is 4 hours)" in broker.conf.
DEFAULT_DELETION_LAG = 4 * 3600.0
OFFLOAD_SCHEMES = ("file", "s3")


def check_offload_url(url: str) -> str:
    """``url`` when it names a store of a kind offloading writes to (``file://`` or
    ``s3://``) on one line; ValueError naming the kinds otherwise. Its other parts are the
    object-store layer's to check (``aiobk.tiered.open``)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in OFFLOAD_SCHEMES or not rest:
        raise ValueError(f"offload store {url!r}: expected a file:// or s3:// URL")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"offload store {url!r}: a URL has no spaces or control characters")
    return url


@dataclass(frozen=True, slots=True)
class OffloadStoreSettings:
    """The cluster's offload store (key ``PREFIX/offload/store``): where new offloads write
    (``url``, without credentials: those come from the environment of whoever opens it), how
    long, in seconds, a copied ledger keeps its bookie copies before they are released
    (``deletion_lag``), and when the record was set (``set_at``, milliseconds since the epoch).
    A new URL affects only offloads that start after it: each ledger's ``OffloadRecord`` names
    the store it went to. Fields this version does not know are kept as read."""

    url: str
    deletion_lag: float = DEFAULT_DELETION_LAG
    set_at: int = 0
    version: int = field(default=-1, compare=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise ValueError(f"offload store url must be a non-empty string, got {self.url!r}")
        _number(self.deletion_lag, "deletion_lag")
        _count(self.set_at, "set_at")

    def to_json(self) -> bytes:
        return _dump({
            **self.extra,
            "url": self.url,
            "deletion_lag": self.deletion_lag,
            "set_at": self.set_at,
        })  # fmt: skip

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> OffloadStoreSettings:
        d = _load(data, "offload store record")
        try:
            url = d["url"]
            if not isinstance(url, str):
                raise TypeError(f"url must be a string, got {url!r}")
            return cls(
                url,
                _number(d.get("deletion_lag", DEFAULT_DELETION_LAG), "deletion_lag"),
                _count(d.get("set_at", 0), "set_at"),
                version,
                {k: v for k, v in d.items() if k not in _STORE_FIELDS},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MetadataFormatError(f"unreadable offload store record: {exc!r}") from None


_STORE_FIELDS = frozenset({"format", "url", "deletion_lag", "set_at"})
