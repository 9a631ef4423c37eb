"""The entry body: what a writer sends in an add and a reader gets back.

Layout (big-endian), after BookKeeper's entry format::

    u8  format version (1)
    u8  digest type
    i64 ledger id
    i64 entry id
    i64 last add confirmed when the writer sent it (piggybacked LAC)
    i64 length: ledger length in bytes including this entry's payload
    digest (size fixed by the digest type)
    payload

The digest covers the 34 header bytes and the payload; it is computed and checked by the
client (``client.digest``). The bookie only reads the header, to check the ids against the
request and to learn the piggybacked LAC.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

ENTRY_FORMAT_VERSION = 1
ENTRY_HEADER = struct.Struct(">BBqqqq")
HEADER_SIZE = ENTRY_HEADER.size


class DigestType(IntEnum):
    """The digest each entry of a ledger carries, fixed when the ledger is created.

    ``CRC32C`` (the default) catches corruption on disk or on the wire; ``MAC``
    (HMAC-SHA256 keyed by the ledger's password) also catches forgery; ``DUMMY`` carries none.
    """

    DUMMY = 0  # no digest (tests and benchmarks that want the floor)
    CRC32C = 1  # default: hardware CRC32C
    MAC = 2  # HMAC-SHA256 keyed by the ledger password

    @property
    def size(self) -> int:
        """The digest's length in bytes."""
        return _DIGEST_SIZES[self]


_DIGEST_SIZES = {DigestType.DUMMY: 0, DigestType.CRC32C: 4, DigestType.MAC: 32}


class MalformedEntryError(ValueError):
    """An entry body that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class EntryBody:
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    digest_type: DigestType
    digest: bytes
    payload: bytes

    @property
    def signed_part(self) -> bytes:
        """The bytes the digest covers, header without the digest."""
        return pack_header(self.ledger_id, self.entry_id, self.lac, self.length, self.digest_type)


def pack_header(ledger_id: int, entry_id: int, lac: int, length: int, digest: DigestType) -> bytes:
    return ENTRY_HEADER.pack(ENTRY_FORMAT_VERSION, digest, ledger_id, entry_id, lac, length)


def pack_entry(header: bytes, digest: bytes, payload: bytes) -> bytes:
    return b"".join((header, digest, payload))


def peek_header(body: bytes) -> tuple[int, int, int]:
    """(ledger id, entry id, piggybacked LAC) without copying the payload."""
    if len(body) < HEADER_SIZE:
        raise MalformedEntryError(f"entry body of {len(body)} bytes is shorter than its header")
    version, digest_type, ledger_id, entry_id, lac, _length = ENTRY_HEADER.unpack_from(body)
    if version != ENTRY_FORMAT_VERSION:
        raise MalformedEntryError(f"entry format version {version} is not supported")
    size = _DIGEST_SIZES.get(digest_type)
    if size is None:
        raise MalformedEntryError(f"unknown digest type {digest_type}")
    if len(body) < HEADER_SIZE + size:
        raise MalformedEntryError("entry body is shorter than its digest")
    return ledger_id, entry_id, lac


def parse_entry(body: bytes) -> EntryBody:
    peek_header(body)
    _version, digest_type, ledger_id, entry_id, lac, length = ENTRY_HEADER.unpack_from(body)
    kind = DigestType(digest_type)
    end = HEADER_SIZE + kind.size
    return EntryBody(
        ledger_id, entry_id, lac, length, kind, bytes(body[HEADER_SIZE:end]), bytes(body[end:])
    )
