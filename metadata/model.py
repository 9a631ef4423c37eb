"""Ledger metadata: an immutable value with a version ("The BookKeeper protocol", "Ledger
Metadata").

A ledger has an ensemble size E, a write quorum WQ and an ack quorum AQ (E >= WQ >= AQ >= 1),
a state OPEN | IN_RECOVERY | CLOSED, a last entry id that is set exactly when the state is
CLOSED, and one or more fragments: (first entry id, ensemble) pairs whose first entry ids
strictly increase from 0 ("A Guide to the BookKeeper Replication Protocol", "Ledger
Fragments"). Bookies are named by bookie id.

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
    version: int = field(default=-1, compare=False)

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
        if not isinstance(self.custom_metadata, MappingProxyType):
            object.__setattr__(
                self, "custom_metadata", MappingProxyType(dict(self.custom_metadata))
            )

    # ------------------------------------------------------------------ queries

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

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
                version=version,
            )
        except MetadataFormatError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetadataFormatError(f"unreadable ledger metadata: {exc!r}") from None


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
