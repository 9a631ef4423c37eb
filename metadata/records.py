"""The other values the metadata store keeps: the cluster record, bookie registrations, cookies,
log records.

All JSON with a ``format`` number, all immutable, each carrying the store version it was read
at (``version``, not serialized).
"""

from __future__ import annotations

import dataclasses
import json
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

    def to_json(self) -> bytes:
        fields: dict[str, Any] = {**self.extra, "name": self.name, "ledgers": list(self.ledgers)}
        if self.record_format != "raw":
            fields["record_format"] = self.record_format
        if self.writer >= 0:
            fields["writer"] = self.writer
        if self.producers is not None:
            fields["producers"] = self.producers.to_dict()
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
            extra = {k: v for k, v in d.items() if k not in _LOG_FIELDS}
            return cls(str(d["name"]), ledgers, version, record_format, writer, extra, producers)
        except (KeyError, TypeError) as exc:
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


_LOG_FIELDS = frozenset({"format", "name", "ledgers", "record_format", "writer", "producers"})
