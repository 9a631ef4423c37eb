"""The entry logs' format: append-only files holding the entries of every ledger, interleaved.

Record layout::

    u32 length of what follows the crc | u32 crc32c | i64 ledger id | i64 entry id | body

A location is ``log_id << 40 | offset`` (one int64 per entry in the index). Beside a complete
log ``XXXXXXXX.log`` may lie ``XXXXXXXX.cnt`` (its number of records) and ``XXXXXXXX.lmap``
(pairs of big-endian u64: ledger, record bytes; see ``bookie.entrylog.tallies``).

Every read checks the record's CRC and ids (``check_record``); a mismatch raises
``CorruptEntryError`` so that the bookie answers EIO instead of serving bad bytes. The names
here are what the writing, reading and counting parts of the entry logger share.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c

from aiobk.bookie.stats import BookieStats

RECORD_HEAD = struct.Struct(">IIqq")
IDS = struct.Struct(">qq")
FILE_MAGIC = b"AIOBKLOG\x00\x00\x00\x01"  # 12 bytes: magic and format version
SUFFIX = ".log"
OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1
SCAN_BLOCK = 1 << 20  # bytes read at a time when walking a log's records
PAGE = 4096
# An entry read takes the rest of the page its record starts in, or that and the next page when
# under READ_MIN is left: one page from a cold disk for most small records, where a fixed 4 KiB
# from an unaligned offset always spanned two (a record past the guess is read in a second go).
READ_MIN = 1024
# No record is longer: an entry arrives in one frame, and a frame is at most 64 MiB
# (``BookieConfig.max_frame_size``'s bound). A longer length read from a log is damage, never a
# size to allocate.
MAX_RECORD = 64 << 20


class CorruptEntryError(Exception):
    """A stored entry failed its checksum or does not belong where the index says."""


def pack_location(log_id: int, offset: int) -> int:
    return (log_id << OFFSET_BITS) | offset


def pack_records(
    data: bytearray,
    start: int,
    max_size: int,
    location_base: int,
    ledger_id: int,
    entries: Sequence[tuple[int, bytes]],
    first: int,
    locations: list[int],
) -> int:
    """Append to ``data`` -- a log's bytes from file offset ``start`` on -- the records of
    ``entries[first:]`` (entry id, body) of ``ledger_id``, until the next would take the log
    past ``max_size`` (a log's first record always goes in), and each one's location
    (``location_base | offset``, ``location_base`` being ``log_id << OFFSET_BITS``) to
    ``locations``; return the index of the first entry not appended (``len(entries)`` when
    all were)."""
    pack_head, pack_ids, crc = RECORD_HEAD.pack, IDS.pack, crc32c.crc32c
    head_size = RECORD_HEAD.size
    magic_size = len(FILE_MAGIC)
    index = first
    count = len(entries)
    while index < count:
        entry_id, body = entries[index]
        size = head_size + len(body)
        offset = start + len(data)
        if offset + size > max_size and offset > magic_size:
            break
        checksum = crc(body, crc(pack_ids(ledger_id, entry_id)))
        data += pack_head(size - 8, checksum, ledger_id, entry_id)
        data += body
        locations.append(location_base | offset)
        index += 1
    return index


def unpack_location(location: int) -> tuple[int, int]:
    return location >> OFFSET_BITS, location & OFFSET_MASK


def log_name(log_id: int) -> str:
    return f"{log_id:08x}{SUFFIX}"


def count_name(log_id: int) -> str:
    return f"{log_id:08x}.cnt"


def map_name(log_id: int) -> str:
    return f"{log_id:08x}.lmap"


LEDGER_BYTES = struct.Struct(">QQ")


def check_record(
    record: bytes, log_id: int, offset: int, ledger_id: int, entry_id: int, stats: BookieStats
) -> bytes:
    if len(record) < RECORD_HEAD.size:
        stats.corrupt_reads += 1
        raise CorruptEntryError(f"entry log {log_id:x}: short record at {offset}")
    length, crc, stored_ledger, stored_entry = RECORD_HEAD.unpack_from(record)
    body = record[RECORD_HEAD.size :]
    if len(body) != length - IDS.size or crc32c.crc32c(body, crc32c.crc32c(record[8:24])) != crc:
        stats.corrupt_reads += 1
        raise CorruptEntryError(f"entry log {log_id:x}: checksum mismatch at {offset}")
    if (stored_ledger, stored_entry) != (ledger_id, entry_id):
        stats.corrupt_reads += 1
        raise CorruptEntryError(
            f"entry log {log_id:x} at {offset} holds {stored_ledger}/{stored_entry}, "
            f"not {ledger_id}/{entry_id}"
        )
    return body


def check_records(
    block: bytes, start: int, ledger_id: int, run: Sequence[tuple[int, int]]
) -> list[bytes] | None:
    """The bodies of ``run`` -- (entry id, location) of one ledger's records in one log, in
    file order -- taken from ``block``, that log's bytes from file offset ``start`` on, when
    every record lies wholly in ``block`` and passes ``check_record``'s checks; else None, and
    the caller's record-by-record loop reads what lies past ``block`` and says what is wrong.
    (``aiobk.bookie._records.check_records`` is its compiled twin.)"""
    bodies: list[bytes] = []
    head, crc = RECORD_HEAD.size, crc32c.crc32c
    for entry_id, location in run:
        at = (location & OFFSET_MASK) - start
        if at < 0 or at + head > len(block):
            return None
        length, checksum, stored_ledger, stored_entry = RECORD_HEAD.unpack_from(block, at)
        end = at + 8 + length
        if length < IDS.size or end > len(block) or end - at > MAX_RECORD:
            return None
        if crc(block[at + 8 : end]) != checksum or (stored_ledger, stored_entry) != (
            ledger_id,
            entry_id,
        ):
            return None
        bodies.append(block[at + head : end])
    return bodies


def run_end(wanted: Sequence[tuple[int, int]], at: int, limit: int) -> int:
    """Where the run of records from ``wanted[at]`` ends (see ``EntryReader.read_many``): the
    next locations of ``wanted`` in the same log, each after the one before, all before file
    offset ``limit``. (``aiobk.bookie._records.run_end`` is its compiled twin.)"""
    log_id = wanted[at][1] >> OFFSET_BITS
    previous = wanted[at][1] & OFFSET_MASK
    end = at + 1
    while end < len(wanted):
        location = wanted[end][1]
        offset = location & OFFSET_MASK
        if location >> OFFSET_BITS != log_id or not previous < offset < limit:
            break
        previous = offset
        end += 1
    return end


def side_of(name: str) -> int | None:
    """The log id a ``.cnt`` or ``.lmap`` file belongs to; None for any other name."""
    stem, _dot, suffix = name.partition(".")
    if suffix in ("cnt", "lmap") and len(stem) == 8 and all(c in "0123456789abcdef" for c in stem):
        return int(stem, 16)
    return None


def is_log(name: str) -> bool:
    return (
        name.endswith(SUFFIX) and len(name) == 12 and all(c in "0123456789abcdef" for c in name[:8])
    )
