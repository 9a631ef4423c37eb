"""Journal files and records, as bytes. Pure: no I/O.

A journal file is a 24-byte header then records::

    header: b"AIOBKJNL" | u32 version | u64 first LSN | u32 crc32c(previous 20 bytes)
    record: u16 magic 0xB00C | u8 type | u32 payload length | u64 LSN | u32 crc32c | payload

The CRC of a record covers its type, length, LSN and payload. LSNs (log sequence numbers) are
dense across files: a file's first LSN is one more than the last LSN before it, which lets
replay prove that no record is missing between the checkpoint and the end.

``scan`` tells a torn tail (a crash during the last write: nothing valid follows) from
corruption in the middle (a valid record follows a bad one), because the first may be dropped
safely -- none of it was acknowledged -- and the second may hide acknowledged adds.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import crc32c

FILE_MAGIC = b"AIOBKJNL"
FILE_VERSION = 1
FILE_HEADER = struct.Struct(">8sIQI")
RECORD_MAGIC = 0xB00C
RECORD_HEADER = struct.Struct(">HBIQI")
_CRC_PART = struct.Struct(">BIQ")
MAX_RECORD_PAYLOAD = 64 * 1024 * 1024

ADD_PREFIX = struct.Struct(">qq")  # ledger id, entry id
LEDGER_PREFIX = struct.Struct(">q")
LEDGER_VALUE = struct.Struct(">qq")


class RecordType(IntEnum):
    ADD = 1  # ledger id, entry id, entry body
    MASTER_KEY = 2  # ledger id, master key
    FENCE = 3  # ledger id
    EXPLICIT_LAC = 4  # ledger id, lac
    LIMBO = 5  # ledger id, 0/1 (BP-46)
    PADDING = 6  # zeros that align the next write (journal_alignment); no LSN of its own


class JournalCorruptError(Exception):
    """The journal cannot be trusted: a bad record is followed by good ones, or LSNs skip."""


def encode_file_header(first_lsn: int) -> bytes:
    head = FILE_MAGIC + struct.pack(">IQ", FILE_VERSION, first_lsn)
    return head + struct.pack(">I", crc32c.crc32c(head))


def decode_file_header(data: bytes) -> int:
    """The first LSN of a journal file, or JournalCorruptError."""
    if len(data) < FILE_HEADER.size:
        raise JournalCorruptError("journal file is shorter than its header")
    magic, version, first_lsn, crc = FILE_HEADER.unpack_from(data)
    if magic != FILE_MAGIC or crc != crc32c.crc32c(data[:20]):
        raise JournalCorruptError("journal file header is damaged")
    if version != FILE_VERSION:
        raise JournalCorruptError(f"journal file version {version} is not supported")
    return int(first_lsn)


def encode_record(kind: RecordType, lsn: int, payload: bytes) -> bytes:
    crc = crc32c.crc32c(payload, crc32c.crc32c(_CRC_PART.pack(kind, len(payload), lsn)))
    return RECORD_HEADER.pack(RECORD_MAGIC, kind, len(payload), lsn, crc) + payload


_ADD_HEAD = struct.Struct(">HBIQIqq")  # RECORD_HEADER, then ADD_PREFIX


def encode_adds(first_lsn: int, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> bytes:
    """The ADD records of one ledger's entries, LSNs from ``first_lsn``: byte for byte
    ``encode_record(ADD, lsn, add_payload(ledger_id, entry_id, body))`` of each, joined --
    built without the two copies of each body those make."""
    parts: list[bytes] = []
    append = parts.append
    crc, crc_part, prefix, head = crc32c.crc32c, _CRC_PART.pack, ADD_PREFIX.pack, _ADD_HEAD.pack
    kind, magic = RecordType.ADD, RECORD_MAGIC
    lsn = first_lsn
    for entry_id, body in entries:
        size = ADD_PREFIX.size + len(body)
        checksum = crc(body, crc(prefix(ledger_id, entry_id), crc(crc_part(kind, size, lsn))))
        append(head(magic, kind, size, lsn, checksum, ledger_id, entry_id))
        append(body)
        lsn += 1
    return b"".join(parts)


def padding(position: int, alignment: int) -> bytes:
    """A padding record taking a write that ends at ``position`` to the next ``alignment``
    boundary (BookKeeper's journalAlignmentSize): the next write then starts on a boundary of
    its own -- a fresh sector at 512, a fresh page at 4096 (``policy.JOURNAL_ALIGNMENT``
    says which and why). Replay skips padding of any size, so a journal written at one
    alignment reads back under any other."""
    if alignment <= 0:
        return b""
    gap = -position % alignment
    while 0 < gap < RECORD_HEADER.size:
        gap += alignment
    if gap == 0:
        return b""
    return _padding_record(gap)


@functools.lru_cache(maxsize=16)
def _padding_record(gap: int) -> bytes:
    """The padding record of ``gap`` bytes: always the same bytes (LSN 0, zeros), so the few
    sizes a writer of like-sized entries keeps needing are made once -- not a zeroed buffer
    and a CRC over it per journal write, on the lone add's path."""
    return encode_record(RecordType.PADDING, 0, bytes(gap - RECORD_HEADER.size))


def add_payload(ledger_id: int, entry_id: int, body: bytes) -> bytes:
    return ADD_PREFIX.pack(ledger_id, entry_id) + body


@dataclass(frozen=True, slots=True)
class Record:
    kind: RecordType
    lsn: int
    payload: bytes
    end: int  # offset just past this record


def _parse_at(data: bytes, offset: int) -> Record | None:
    """The valid record at ``offset`` or None (incomplete, bad magic, bad CRC)."""
    if len(data) - offset < RECORD_HEADER.size:
        return None
    magic, kind, length, lsn, crc = RECORD_HEADER.unpack_from(data, offset)
    if magic != RECORD_MAGIC or length > MAX_RECORD_PAYLOAD:
        return None
    start = offset + RECORD_HEADER.size
    end = start + length
    if end > len(data):
        return None
    payload = bytes(data[start:end])
    if crc != crc32c.crc32c(payload, crc32c.crc32c(_CRC_PART.pack(kind, length, lsn))):
        return None
    try:
        record_type = RecordType(kind)
    except ValueError:
        return None
    return Record(record_type, lsn, payload, end)


class Stop(IntEnum):
    END = 0  # the data ended exactly after a record
    INCOMPLETE = 1  # the data ends inside a record (read more, or a torn tail at end of file)
    INVALID = 2  # bad magic, length, type or CRC at the stop offset


def scan(data: bytes, offset: int = 0) -> tuple[list[Record], int, Stop]:
    """The valid records of ``data`` from ``offset``, where the scan stopped, and why."""
    records: list[Record] = []
    end = len(data)
    while offset < end:
        if end - offset < RECORD_HEADER.size:
            return records, offset, Stop.INCOMPLETE
        magic, _kind, length, _lsn, _crc = RECORD_HEADER.unpack_from(data, offset)
        if magic != RECORD_MAGIC or length > MAX_RECORD_PAYLOAD:
            return records, offset, Stop.INVALID
        if offset + RECORD_HEADER.size + length > end:
            return records, offset, Stop.INCOMPLETE
        record = _parse_at(data, offset)
        if record is None:
            return records, offset, Stop.INVALID
        records.append(record)
        offset = record.end
    return records, offset, Stop.END


def valid_record_after(data: bytes, offset: int) -> int | None:
    """Offset of a valid record somewhere after ``offset``, or None: tells a torn tail (None)
    from corruption in the middle of the journal (a valid record follows a bad one)."""
    needle = struct.pack(">H", RECORD_MAGIC)
    position = data.find(needle, offset + 1)
    while position != -1:
        if _parse_at(data, position) is not None:
            return position
        position = data.find(needle, position + 1)
    return None
