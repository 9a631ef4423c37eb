"""Ledger metadata: an immutable value with a version ("The BookKeeper protocol", "Ledger
Metadata").

A ledger has an ensemble size E, a write quorum WQ and an ack quorum AQ (E >= WQ >= AQ >= 1),
a state OPEN | IN_RECOVERY | CLOSED, a last entry id that is set exactly when the state is
CLOSED, and one or more fragments: (first entry id, ensemble) pairs whose first entry ids
strictly increase from 0 ("A Guide to the BookKeeper Replication Protocol", "Ledger
Fragments"). Bookies are named by bookie id.

A closed ledger copied to an object store carries an ``OffloadRecord``: which attempt copied it,
where to, and how far the copy got (copying, copied, bookie copies released).

Serialized as JSON (readable with ``etcdctl get``) carrying a ``format`` number so later
versions can read what earlier ones wrote. ``version`` is the store's version of the value
(etcd's mod revision); it is not part of the JSON.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from aiobk.protocol import DigestType, Durability

FORMAT = 1


class MetadataFormatError(ValueError):
    """Stored metadata that cannot be read (corrupt, or written by a newer format)."""


class LedgerState(StrEnum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


Ensemble = tuple[str, ...]


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Slots of a fragment's ensemble that store ``entry_id``: the WQ consecutive slots from
    ``entry_id mod E``, wrapping ("The BookKeeper protocol", "Write quorums": E=4, WQ=3,
    entry 2 -> B3, B4, B1).

    Part of the ledger's layout, so here: the client writes and reads by it, and a bookie
    repairing itself (BP-46 phase two) copies back exactly the entries it names."""
    start = entry_id % ensemble_size
    return [(start + i) % ensemble_size for i in range(write_quorum)]


@dataclass(frozen=True, slots=True)
class Fragment:
    first_entry_id: int
    ensemble: Ensemble

    def __repr__(self) -> str:
        return f"{self.first_entry_id}:[{', '.join(self.ensemble)}]"


class OffloadState(StrEnum):
    """How far the copy of a ledger to an object store got: ``COPYING`` (an attempt is writing
    the object, which may be incomplete), ``COPIED`` (the object is whole and verified; the
    bookies still hold the entries), ``RELEASED`` (the bookies' copies may be dropped: the
    object is the ledger's only copy)."""

    COPYING = "copying"
    COPIED = "copied"
    RELEASED = "released"


@dataclass(frozen=True, slots=True)
class OffloadRecord:
    """A ledger's copy in an object store (``LedgerMetadata.offload``, JSON key ``"offload"``).

    ``uid`` names the attempt, so an attempt that finds another uid knows it lost the ledger;
    ``store`` is the store's URL without credentials (the record stays readable after the
    cluster's store changes) and ``key`` the object's key in it. Times are milliseconds since
    the epoch: ``started`` when the attempt took the ledger, ``copied`` and ``released`` when
    it reached those states. The rest describe the object once it is copied: its ``size``, its
    index (``index_offset``, ``index_length``, ``index_crc``), the number of ``entries`` and
    the ``block_size`` it was written with. Fields a newer version adds (``extra``) are kept
    as read and written back."""

    uid: str
    store: str
    key: str
    state: OffloadState
    started: int  # milliseconds
    copied: int | None = None
    released: int | None = None
    size: int = 0
    index_offset: int = 0
    index_length: int = 0
    index_crc: int = 0
    entries: int = 0
    block_size: int = 0
    extra: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        for name in ("uid", "store", "key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"offload {name} must be a non-empty string, got {value!r}")
        if not isinstance(self.state, OffloadState):
            raise ValueError(f"unknown offload state {self.state!r}")
        for name in _OFFLOAD_COUNTS:
            value = getattr(self, name)
            if value is None and name in ("copied", "released"):
                continue
            if _int(value) < 0:
                raise ValueError(f"offload {name} must not be negative, got {value}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the record (``copied`` and ``released`` only when set)."""
        document: dict[str, Any] = {
            **self.extra,
            "uid": self.uid,
            "store": self.store,
            "key": self.key,
            "state": self.state.value,
        }
        for name in _OFFLOAD_COUNTS:
            value = getattr(self, name)
            if value is not None:
                document[name] = value
        return document

    @classmethod
    def from_dict(cls, document: object) -> OffloadRecord:
        """The record of a JSON object; TypeError or ValueError naming what is wrong."""
        if not isinstance(document, dict):
            raise TypeError(f"offload must be an object, got {document!r}")
        state = document.get("state")
        if state not in _OFFLOAD_STATES:
            raise ValueError(f"unknown offload state {state!r}")
        for name in ("uid", "store", "key"):
            if not isinstance(document.get(name), str):
                raise TypeError(f"offload {name} must be a string, got {document.get(name)!r}")

        def count(name: str) -> int:
            return _int(document.get(name, 0))

        def moment(name: str) -> int | None:
            value = document.get(name)
            return None if value is None else _int(value)

        return cls(
            uid=document["uid"],
            store=document["store"],
            key=document["key"],
            state=OffloadState(state),
            started=_int(document.get("started")),
            copied=moment("copied"),
            released=moment("released"),
            size=count("size"),
            index_offset=count("index_offset"),
            index_length=count("index_length"),
            index_crc=count("index_crc"),
            entries=count("entries"),
            block_size=count("block_size"),
            extra=MappingProxyType({k: v for k, v in document.items() if k not in _OFFLOAD_FIELDS}),
        )


_OFFLOAD_COUNTS = (
    "started", "copied", "released", "size", "index_offset", "index_length", "index_crc",
    "entries", "block_size",
)  # fmt: skip
_OFFLOAD_FIELDS = frozenset({"uid", "store", "key", "state", *_OFFLOAD_COUNTS})
_OFFLOAD_STATES = frozenset(state.value for state in OffloadState)


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    fragments: tuple[Fragment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int | None = None  # set exactly when CLOSED (-1: closed empty)
    length: int = 0
    durability: Durability = Durability.PERSISTENT
    digest_type: DigestType = DigestType.CRC32C
    # ``key_digest(password_salt, master key)`` (protocol.keys), which a bookie can check a
    # master key against. Without a salt (metadata written before ledgers had one): the legacy
    # unsalted digest of the password, which only a client holding the password can check.
    password_digest: bytes = b""
    custom_metadata: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    creation_time: int = 0  # milliseconds, from the creating client's clock
    password_salt: bytes = b""  # per ledger, random; empty: the legacy digest
    # Its copy in an object store, once a copy was attempted (only a closed ledger's); kept by
    # every other change, as every field is.
    offload: OffloadRecord | None = None
    version: int = field(default=-1, compare=False)
    # Fields a newer version wrote that this one does not know: kept as read and written back
    # with every change (closing, an ensemble change, a repair), so what a newer client
    # recorded survives an older one updating the ledger.
    extra: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        e, wq, aq = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not (e >= wq >= aq >= 1):
            raise ValueError(f"need ensemble >= write quorum >= ack quorum >= 1, got {e}/{wq}/{aq}")
        if not self.fragments:
            raise ValueError("a ledger has at least one fragment")
        if self.fragments[0].first_entry_id != 0:
            raise ValueError("the first fragment starts at entry 0")
        previous = -1
        for fragment in self.fragments:
            if fragment.first_entry_id <= previous:
                raise ValueError("fragment first entry ids must strictly increase")
            previous = fragment.first_entry_id
            if len(fragment.ensemble) != e:
                raise ValueError(f"fragment {fragment!r} does not have {e} bookies")
            if len(set(fragment.ensemble)) != e:
                raise ValueError(f"fragment {fragment!r} names a bookie twice")
        if self.state is LedgerState.CLOSED:
            if self.last_entry_id is None or self.last_entry_id < -1:
                raise ValueError("a closed ledger has a last entry id (>= -1)")
        elif self.last_entry_id is not None:
            raise ValueError(f"a ledger in state {self.state.value} has no last entry id yet")
        if self.length < 0:
            raise ValueError("length must not be negative")
        if self.offload is not None and not isinstance(self.offload, OffloadRecord):
            raise ValueError(f"offload must be an OffloadRecord, got {self.offload!r}")
        if not isinstance(self.custom_metadata, MappingProxyType):
            object.__setattr__(
                self, "custom_metadata", MappingProxyType(dict(self.custom_metadata))
            )

    # ------------------------------------------------------------------ queries

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def is_offloaded(self) -> bool:
        """Whether a complete copy is in the object store (copied or released): readers fall
        back to it, and autorecovery leaves the bookies' copies alone."""
        return self.offload is not None and self.offload.state is not OffloadState.COPYING

    @property
    def last_fragment(self) -> Fragment:
        return self.fragments[-1]

    @property
    def ensemble(self) -> Ensemble:
        """The current (last) ensemble."""
        return self.fragments[-1].ensemble

    def fragment_for(self, entry_id: int) -> Fragment:
        """The fragment whose ensemble holds ``entry_id``."""
        chosen = self.fragments[0]
        for fragment in self.fragments:
            if fragment.first_entry_id > entry_id:
                break
            chosen = fragment
        return chosen

    def bookies(self) -> set[str]:
        return {bookie for fragment in self.fragments for bookie in fragment.ensemble}

    # ------------------------------------------------------------------ changes

    def replace(self, **changes: Any) -> LedgerMetadata:
        return dataclasses.replace(self, **changes)

    def with_version(self, version: int) -> LedgerMetadata:
        return dataclasses.replace(self, version=version)

    def in_recovery(self) -> LedgerMetadata:
        return self.replace(state=LedgerState.IN_RECOVERY)

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return self.replace(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_fragment(self, first_entry_id: int, ensemble: Ensemble) -> LedgerMetadata:
        """Add a fragment; one starting where the last one starts replaces it."""
        fragments = list(self.fragments)
        if fragments[-1].first_entry_id == first_entry_id:
            fragments[-1] = Fragment(first_entry_id, tuple(ensemble))
        else:
            fragments.append(Fragment(first_entry_id, tuple(ensemble)))
        return self.replace(fragments=tuple(fragments))

    def with_offload(self, record: OffloadRecord | None) -> LedgerMetadata:
        """The same ledger with its offload record replaced (None: removed)."""
        return self.replace(offload=record)

    def __repr__(self) -> str:
        last = "" if self.last_entry_id is None else f" last={self.last_entry_id}"
        frags = ", ".join(repr(f) for f in self.fragments)
        return (
            f"LedgerMetadata(E={self.ensemble_size} WQ={self.write_quorum} AQ={self.ack_quorum} "
            f"{self.state.value}{last} length={self.length} {self.durability.name.lower()} "
            f"fragments=[{frags}] v{self.version})"
        )

    # ------------------------------------------------------------------ serialization

    def to_json(self) -> bytes:
        document = {
            **self.extra,
            "format": FORMAT,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "fragments": [
                {"first_entry_id": f.first_entry_id, "ensemble": list(f.ensemble)}
                for f in self.fragments
            ],
            "durability": self.durability.name,
            "digest_type": self.digest_type.name,
            "password_digest": _b64(self.password_digest),
            "custom_metadata": {k: _b64(v) for k, v in self.custom_metadata.items()},
            "creation_time": self.creation_time,
        }
        if self.password_salt:  # absent: the legacy form, as written before the salt existed
            document["password_salt"] = _b64(self.password_salt)
        if self.offload is not None:  # absent until a copy is attempted: older versions' form
            document["offload"] = self.offload.to_dict()
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, version: int = -1) -> LedgerMetadata:
        try:
            document = json.loads(data)
            if not isinstance(document, dict):
                raise MetadataFormatError("ledger metadata is not a JSON object")
            fmt = document.get("format")
            if fmt != FORMAT:
                raise MetadataFormatError(f"ledger metadata format {fmt!r} is not supported")
            return cls(
                ensemble_size=_int(document["ensemble_size"]),
                write_quorum=_int(document["write_quorum"]),
                ack_quorum=_int(document["ack_quorum"]),
                state=LedgerState(document["state"]),
                last_entry_id=None
                if document["last_entry_id"] is None
                else _int(document["last_entry_id"]),
                length=_int(document["length"]),
                fragments=tuple(
                    Fragment(_int(f["first_entry_id"]), tuple(str(b) for b in f["ensemble"]))
                    for f in document["fragments"]
                ),
                durability=Durability[document["durability"]],
                digest_type=DigestType[document["digest_type"]],
                password_digest=_unb64(document["password_digest"]),
                custom_metadata={
                    str(k): _unb64(v) for k, v in dict(document["custom_metadata"]).items()
                },
                creation_time=_int(document["creation_time"]),
                password_salt=_unb64(document.get("password_salt", "")),
                offload=None
                if document.get("offload") is None
                else OffloadRecord.from_dict(document["offload"]),
                version=version,
                extra=MappingProxyType(
                    {k: v for k, v in document.items() if k not in _LEDGER_FIELDS}
                ),
            )
        except MetadataFormatError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetadataFormatError(f"unreadable ledger metadata: {exc!r}") from None


_LEDGER_FIELDS = frozenset({
    "format", "ensemble_size", "write_quorum", "ack_quorum", "state", "last_entry_id", "length",
    "fragments", "durability", "digest_type", "password_digest", "custom_metadata",
    "creation_time", "password_salt", "offload",
})  # fmt: skip


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise TypeError("expected base64 text")
    return base64.b64decode(text, validate=True)
