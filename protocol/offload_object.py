"""The offload object: one closed ledger as one object in an object store (format 1).

An offloaded ledger's entries live in a single object, named by its ledger's metadata. The
object is part of the storage contract, as the entry format is: a release that reads format 1
reads every object ever written in it. All integers are big-endian; every CRC is CRC32C.

A header, the data blocks back to back, the index block, and a footer::

    [header 64][block][block]...[index block][footer 64]

**Header** (offset 0, 64 bytes)

====  ====  =================================================================
off   size  field
====  ====  =================================================================
0     8     magic ``AIOBKOBJ``
8     2     format version (1)
10    2     header size (64)
12    4     flags (0)
16    8     ledger id
24    8     first entry id (0: an object holds its ledger from entry 0)
32    8     last entry id (-1 for a ledger without entries)
40    16    uid (the offload attempt that wrote the object)
56    1     digest type of the ledger's entries (``protocol.DigestType``)
57    3     reserved (0)
60    4     CRC32C of bytes 0..59
====  ====  =================================================================

**Data block** (from offset 64, each right after the one before)

====  ====  =================================================================
off   size  field
====  ====  =================================================================
0     4     magic ``ABLK``
4     4     entry count n (at least 1)
8     8     id of the block's first entry
16    ...   n times: u32 body length, then the entry body
====  ====  =================================================================

A body is the entry exactly as the bookie stores it (``protocol.entry``: 34-byte header,
digest, payload), so every entry keeps the digest its writer computed. A block ends before an
entry that would take it past the block size; an entry larger than the block size stands
alone in its block. The blocks let a tool rebuild the index by scanning; readers never need to.

**Index block** (at the footer's index offset; B blocks, N entries)

========  ======  =============================================================
off       size    field
========  ======  =============================================================
0         8       magic ``AIOBKIDX``
8         8       first entry id (0)
16        8       entry count N
24        4       block count B
28        4       reserved (0)
32        16 x N  per entry: u64 body offset (from the object's start), u32 body
                  length, u32 CRC32C of the body
32+16N    16 x B  per block: u64 offset, u32 length, u32 position of its first
                  entry among the N
========  ======  =============================================================

Entry ``i``'s record sits at ``index offset + 32 + 16 * i``: one ranged read of
``16 * (b - a + 1)`` bytes locates entries ``a..b`` (``index_span``), and the bodies come
straight from their offsets, block headers and length prefixes skipped.

**Footer** (the object's last 64 bytes)

====  ====  =================================================================
off   size  field
====  ====  =================================================================
0     8     magic ``AIOBKEND``
8     2     format version (1)
10    2     footer size (64)
12    4     reserved (0)
16    8     index offset
24    8     index length
32    8     ledger id
40    8     entry count
48    8     object length
56    4     CRC32C of the index block
60    4     CRC32C of bytes 0..59
====  ====  =================================================================

A ledger without entries is a header, an index block of 32 bytes and a footer. The ledger's
metadata repeats the index offset, length and CRC and the object's length, so a reader with
the metadata skips the footer.

A reader with a range of ids goes ``index_span`` -> ``parse_locations`` -> ``check_body``;
a full check (after a copy, or a tool with the object's bytes) goes ``parse_header``,
``parse_footer``, ``check_footer``, then ``parse_index`` (the index's CRC, and its blocks and
locations tiling the data exactly) and ``parse_block`` for each block; ``parse_object`` does all
of it for an object in memory.

Every failure to parse raises ``MalformedObjectError`` with a one-line message; what an encoder
is given wrongly (ids out of order, a body too long for its length field) is a ``ValueError``.
Pure: no I/O here (``tiered.objects`` moves the bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import crc32c

from aiobk.extensions import compiled
from aiobk.protocol.entry import DigestType
from aiobk.protocol.errors import MalformedObjectError
from aiobk.protocol.limits import MAX_LEDGER_ID

FORMAT_VERSION = 1
HEADER_SIZE = 64
FOOTER_SIZE = 64
INDEX_RECORD_SIZE = 16
DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024

MAGIC = b"AIOBKOBJ"
BLOCK_MAGIC = b"ABLK"
INDEX_MAGIC = b"AIOBKIDX"
FOOTER_MAGIC = b"AIOBKEND"
UID_SIZE = 16

_HEADER = struct.Struct(">8sHHIqqq16sB3s")  # the header before its CRC
_FOOTER = struct.Struct(">8sHHIQQqQQI")  # the footer before its CRC
_CRC = struct.Struct(">I")
_BLOCK = struct.Struct(">4sIq")
_PREFIX = struct.Struct(">I")
_INDEX = struct.Struct(">8sqQII")
_RECORD = struct.Struct(">QII")  # an entry's record and a block's record alike
BLOCK_HEADER_SIZE = _BLOCK.size
INDEX_HEADER_SIZE = _INDEX.size
MAX_BODY_SIZE = 2**32 - 1 - BLOCK_HEADER_SIZE - _PREFIX.size  # a lone body's block fits a u32
MAX_ENTRIES = 2**32 - 1  # a block's first position is a u32
_DIGESTS = frozenset(int(kind) for kind in DigestType)


@dataclass(frozen=True, slots=True)
class ObjectHeader:
    """What the header says: whose entries the object holds, and who wrote it."""

    ledger_id: int
    first_entry: int
    last_entry: int
    uid: bytes  # 16 bytes
    digest_type: int


@dataclass(frozen=True, slots=True)
class ObjectFooter:
    """What the footer says: where the index is, and how long the object is."""

    index_offset: int
    index_length: int
    ledger_id: int
    entry_count: int
    object_length: int
    index_crc: int


class EntryLocation(NamedTuple):
    """Where an entry's body is: its absolute offset and length, and the CRC32C of its bytes
    (a tuple: an index holds one per entry, made from its records in C)."""

    offset: int
    length: int
    crc: int


class BlockLocation(NamedTuple):
    """Where a data block is, and the position (among the object's entries) of its first."""

    offset: int
    length: int
    first: int


class ObjectIndex:
    """The whole index block: every entry's location and every block's.

    ``records`` keeps the entries' records as stored (16 bytes each), which the compiled
    checks read directly; ``locations`` makes them tuples on first use."""

    __slots__ = ("_locations", "blocks", "count", "records")

    def __init__(self, records: bytes, blocks: list[BlockLocation]) -> None:
        self.records = records
        self.blocks = blocks
        self.count = len(records) // INDEX_RECORD_SIZE
        self._locations: list[EntryLocation] | None = None

    @property
    def locations(self) -> list[EntryLocation]:
        """Every entry's location, in position order."""
        if self._locations is None:
            self._locations = parse_locations(self.records, self.count)
        return self._locations

    def block_entries(self, number: int) -> range:
        """The positions of the entries in block ``number``."""
        end = self.blocks[number + 1].first if number + 1 < len(self.blocks) else self.count
        return range(self.blocks[number].first, end)


def _crc(data: bytes) -> int:
    return int(crc32c.crc32c(data))


def _fail(message: str) -> MalformedObjectError:
    return MalformedObjectError(f"offload object: {message}")


def pack_header(header: ObjectHeader) -> bytes:
    """The header's 64 bytes; ``ValueError`` for a header format 1 cannot hold."""
    if not 0 <= header.ledger_id <= MAX_LEDGER_ID:
        raise ValueError(f"ledger id {header.ledger_id} is out of range")
    if header.first_entry != 0:
        raise ValueError(f"first entry {header.first_entry}: an object holds a ledger from 0")
    if not -1 <= header.last_entry < MAX_ENTRIES:
        raise ValueError(f"last entry {header.last_entry} is out of range")
    if len(header.uid) != UID_SIZE:
        raise ValueError(f"uid of {len(header.uid)} bytes, not {UID_SIZE}")
    if header.digest_type not in _DIGESTS:
        raise ValueError(f"unknown digest type {header.digest_type}")
    head = _HEADER.pack(
        MAGIC, FORMAT_VERSION, HEADER_SIZE, 0, header.ledger_id, header.first_entry,
        header.last_entry, header.uid, header.digest_type, b"\0\0\0",
    )  # fmt: skip
    return head + _CRC.pack(_crc(head))


def parse_header(data: bytes) -> ObjectHeader:
    """The header from the object's first ``HEADER_SIZE`` bytes."""
    if len(data) != HEADER_SIZE:
        raise _fail(f"a header of {len(data)} bytes, not {HEADER_SIZE}")
    magic, version, size, flags, ledger_id, first, last, uid, digest_type, reserved = (
        _HEADER.unpack_from(data)
    )
    if magic != MAGIC:
        raise _fail(f"magic {magic!r} is not {MAGIC!r}: not an aiobk object")
    if version != FORMAT_VERSION:
        raise _fail(f"format version {version} is not supported (this release reads 1)")
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    if crc != _crc(data[: _HEADER.size]):
        raise _fail(f"header CRC32C {crc:#010x} does not match its bytes")
    if size != HEADER_SIZE or flags != 0 or reserved != b"\0\0\0":
        raise _fail(
            f"header size {size}, flags {flags:#x}, reserved {reserved.hex()}: not format 1"
        )
    if ledger_id < 0 or first != 0 or last < -1:
        raise _fail(f"header names ledger {ledger_id}, entries {first}..{last}")
    if digest_type not in _DIGESTS:
        raise _fail(f"unknown digest type {digest_type} in the header")
    return ObjectHeader(ledger_id, first, last, uid, digest_type)


def pack_footer(footer: ObjectFooter) -> bytes:
    """The footer's 64 bytes."""
    body = _FOOTER.pack(
        FOOTER_MAGIC, FORMAT_VERSION, FOOTER_SIZE, 0, footer.index_offset, footer.index_length,
        footer.ledger_id, footer.entry_count, footer.object_length, footer.index_crc,
    )  # fmt: skip
    return body + _CRC.pack(_crc(body))


def parse_footer(data: bytes) -> ObjectFooter:
    """The footer from the object's last ``FOOTER_SIZE`` bytes, its lengths checked against
    each other."""
    if len(data) != FOOTER_SIZE:
        raise _fail(f"a footer of {len(data)} bytes, not {FOOTER_SIZE}")
    magic, version, size, reserved, index_offset, index_length, ledger_id, count, length, icrc = (
        _FOOTER.unpack_from(data)
    )
    if magic != FOOTER_MAGIC:
        raise _fail(f"footer magic {magic!r} is not {FOOTER_MAGIC!r}: not an aiobk object")
    if version != FORMAT_VERSION:
        raise _fail(f"format version {version} is not supported (this release reads 1)")
    (crc,) = _CRC.unpack_from(data, _FOOTER.size)
    if crc != _crc(data[: _FOOTER.size]):
        raise _fail(f"footer CRC32C {crc:#010x} does not match its bytes")
    if size != FOOTER_SIZE or reserved != 0:
        raise _fail(f"footer size {size}, reserved {reserved:#x}: not format 1")
    if ledger_id < 0 or count > MAX_ENTRIES:
        raise _fail(f"footer names ledger {ledger_id} with {count} entries")
    records = index_length - INDEX_HEADER_SIZE - INDEX_RECORD_SIZE * count
    if index_offset < HEADER_SIZE or records < 0 or records % INDEX_RECORD_SIZE:
        raise _fail(f"an index of {index_length} bytes at {index_offset} for {count} entries")
    if index_offset + index_length + FOOTER_SIZE != length:
        raise _fail(f"object length {length} is not where the index at {index_offset} ends")
    return ObjectFooter(index_offset, index_length, ledger_id, count, length, icrc)


def check_footer(header: ObjectHeader, footer: ObjectFooter) -> None:
    """The footer describes the header's ledger: the same id and number of entries."""
    count = header.last_entry - header.first_entry + 1
    if (header.ledger_id, count) != (footer.ledger_id, footer.entry_count):
        raise _fail(
            f"header names ledger {header.ledger_id} with {count} entries, the footer ledger "
            f"{footer.ledger_id} with {footer.entry_count}"
        )


def index_span(footer: ObjectFooter, first: int, last: int) -> tuple[int, int]:
    """(offset, length) of the index records of entries ``first..last`` (ids; an object holds
    its ledger from entry 0). ``first = last + 1`` is the empty span; ids outside the ledger
    are a ``ValueError``."""
    if not 0 <= first <= last + 1 <= footer.entry_count:
        raise ValueError(
            f"entries {first}..{last} are not in ledger {footer.ledger_id}'s "
            f"0..{footer.entry_count - 1}"
        )
    start = footer.index_offset + INDEX_HEADER_SIZE + INDEX_RECORD_SIZE * first
    return start, INDEX_RECORD_SIZE * (last - first + 1)


def parse_locations(data: bytes, count: int, data_end: int | None = None) -> list[EntryLocation]:
    """The ``count`` entry locations in ``data`` (the bytes ``index_span`` names). With
    ``data_end`` (the index offset: where the data blocks end), a location outside the data
    blocks is malformed too."""
    if len(data) != INDEX_RECORD_SIZE * count:
        raise _fail(f"{len(data)} bytes of index records where {count} take {16 * count}")
    # each made in C: an index holds one per entry
    locations = list(map(tuple.__new__, repeat(EntryLocation), _RECORD.iter_unpack(data)))
    if data_end is not None:
        low = HEADER_SIZE + BLOCK_HEADER_SIZE + _PREFIX.size
        for location in locations:
            if location.offset < low or location.offset + location.length > data_end:
                raise _fail(
                    f"an index record puts a body at {location.offset}+{location.length}, "
                    f"outside the data blocks ({low}..{data_end})"
                )
    return locations


def check_body(entry_id: int, location: EntryLocation, body: bytes) -> bytes:
    """``body`` when its length and CRC32C are the index's for entry ``entry_id``."""
    if len(body) != location.length:
        raise _fail(f"entry {entry_id}: {len(body)} bytes where the index says {location.length}")
    crc = _crc(body)
    if crc != location.crc:
        raise _fail(f"entry {entry_id}: CRC32C {crc:#010x} of its body is not the index's")
    return body


def parse_index(footer: ObjectFooter, data: bytes) -> ObjectIndex:
    """The whole index block (``footer.index_length`` bytes at ``footer.index_offset``), its
    CRC checked and its blocks and locations checked to tile the data region exactly."""
    if len(data) != footer.index_length:
        raise _fail(f"an index of {len(data)} bytes where the footer says {footer.index_length}")
    crc = _crc(data)
    if crc != footer.index_crc:
        raise _fail(f"index CRC32C {crc:#010x} is not the footer's {footer.index_crc:#010x}")
    magic, first, count, block_count, reserved = _INDEX.unpack_from(data)
    if magic != INDEX_MAGIC:
        raise _fail(f"index magic {magic!r} is not {INDEX_MAGIC!r}")
    table = INDEX_HEADER_SIZE + INDEX_RECORD_SIZE * footer.entry_count
    if (first, count, reserved) != (0, footer.entry_count, 0) or (
        len(data) != table + INDEX_RECORD_SIZE * block_count
    ):
        raise _fail(f"index of entries from {first}, {count} entries, {block_count} blocks")
    records = data[INDEX_HEADER_SIZE:table]
    block_records = data[table:]
    index = ObjectIndex(records, list(map(BlockLocation._make, _RECORD.iter_unpack(block_records))))
    if not _check_tiling(records, block_records, HEADER_SIZE, footer.index_offset):
        _check_tiling_pure(index, footer)  # says what is wrong
    return index


def _check_tiling_pure(index: ObjectIndex, footer: ObjectFooter) -> None:
    """The blocks and locations of ``index`` tile the data region exactly (``check_tiling`` in
    ``aiobk.protocol._runs`` is its compiled twin)."""
    blocks, locations, count = index.blocks, index.locations, index.count
    offset = HEADER_SIZE
    for number, block in enumerate(blocks):
        entries = index.block_entries(number)
        if block.offset != offset or not entries or entries.stop > count:
            raise _fail(f"block {number} at {block.offset} holding {len(entries)} entries")
        offset += BLOCK_HEADER_SIZE
        for position, (at, length, _crc32c) in enumerate(
            locations[entries.start : entries.stop], entries.start
        ):
            if at != offset + _PREFIX.size:
                raise _fail(f"entry {position} at {at}, not {offset + 4}")
            offset = at + length
        if offset != block.offset + block.length:
            raise _fail(f"block {number} of {block.length} bytes ends at {offset}")
    if offset != footer.index_offset or (count and (not blocks or blocks[0].first != 0)):
        raise _fail(f"the data blocks end at {offset}, the index is at {footer.index_offset}")


def parse_block(data: bytes, index: ObjectIndex, number: int) -> list[bytes]:
    """The bodies of block ``number`` from its bytes (``index.blocks[number]``), each checked."""
    return _block(data, index, number, keep=True)


def check_block(data: bytes, index: ObjectIndex, number: int) -> None:
    """``parse_block``'s checks, without taking the bodies out (a read-back's)."""
    _block(data, index, number, keep=False)


def _block(data: bytes, index: ObjectIndex, number: int, *, keep: bool) -> list[bytes]:
    block = index.blocks[number]
    entries = index.block_entries(number)
    if len(data) != block.length:
        raise _fail(f"block {number} of {len(data)} bytes where the index says {block.length}")
    magic, count, first = _BLOCK.unpack_from(data)
    if (magic, count, first) != (BLOCK_MAGIC, len(entries), entries.start):
        raise _fail(f"block {number} says {magic!r}, {count} entries from {first}")
    if not keep and _check_entries(data, block.offset, index.records, entries.start, entries.stop):
        return []  # every entry's prefix and CRC32C checked in C
    bodies: list[bytes] = []
    view = memoryview(data)
    unpack_prefix, crc, base, size = _PREFIX.unpack_from, crc32c.crc32c, block.offset, _PREFIX.size
    for position, location in enumerate(
        index.locations[entries.start : entries.stop], entries.start
    ):
        start = location.offset - base
        (length,) = unpack_prefix(data, start - size)
        if length != location.length:
            raise _fail(f"entry {position}'s length prefix {length} is not the index's")
        if crc(view[start : start + length]) != location.crc:
            check_body(position, location, data[start : start + length])  # says what is wrong
        if keep:
            bodies.append(data[start : start + length])
    return bodies


def parse_object(data: bytes) -> tuple[ObjectHeader, list[bytes]]:
    """A whole object in memory, every part checked: its header and its bodies in id order."""
    if len(data) < HEADER_SIZE + FOOTER_SIZE:
        raise _fail(f"{len(data)} bytes are too few for a header and a footer")
    header = parse_header(data[:HEADER_SIZE])
    footer = parse_footer(data[-FOOTER_SIZE:])
    check_footer(header, footer)
    if footer.object_length != len(data):
        raise _fail(f"an object of {len(data)} bytes whose footer says {footer.object_length}")
    end = footer.index_offset + footer.index_length
    index = parse_index(footer, data[footer.index_offset : end])
    bodies: list[bytes] = []
    for number, block in enumerate(index.blocks):
        bodies += parse_block(data[block.offset : block.offset + block.length], index, number)
    return header, bodies


class ObjectEncoder:
    """Writes one object incrementally: ``add`` each entry in id order, then ``finish``. Both
    return the bytes ready to upload, whole blocks at a time, so at most a block is held."""

    def __init__(self, header: ObjectHeader, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block size {block_size} is not positive")
        self._head: bytes | None = pack_header(header)
        self._header = header
        self._block_size = block_size
        self._next = header.first_entry
        self._offset = 0  # bytes handed out so far: where the open block starts
        # The open block: its header's room, then its entries, each a length and a body.
        self._block = bytearray(BLOCK_HEADER_SIZE)
        self._count = 0  # entries in it
        self._block_first = 0  # position of the open block's first entry
        self._records = bytearray()
        self._blocks = bytearray()
        self._footer: ObjectFooter | None = None

    @property
    def footer(self) -> ObjectFooter:
        """The object's footer, once ``finish`` has run."""
        if self._footer is None:
            raise ValueError("the object is not finished")
        return self._footer

    def add(self, entry_id: int, body: bytes) -> list[bytes | bytearray]:
        """Add the next entry; returns the bytes completed by it (perhaps none)."""
        return self.add_run(entry_id, (body,))

    def add_run(self, first_id: int, bodies: Sequence[bytes]) -> list[bytes | bytearray]:
        """Add the next entries, ``first_id`` on; returns the bytes completed by them."""
        if self._footer is not None:
            raise ValueError("the object is finished")
        last = self._header.last_entry
        if first_id != self._next or first_id + len(bodies) - 1 > last:
            wrong = first_id if first_id != self._next else last + 1
            raise ValueError(f"entry {wrong} where entry {self._next} of 0..{last} is next")
        if bodies and max(map(len, bodies)) > MAX_BODY_SIZE:
            position, body = next((p, b) for p, b in enumerate(bodies) if len(b) > MAX_BODY_SIZE)
            entry_id = first_id + position
            raise ValueError(f"entry {entry_id} of {len(body)} bytes is too long for format 1")
        out = self._start()
        at = 0
        while at < len(bodies):
            stop = _pack_run(self._block, self._block_size, self._records, self._offset, bodies, at)
            self._count += stop - at
            self._next += stop - at
            at = stop
            if at < len(bodies) or len(self._block) >= self._block_size:
                out.append(self._close())
        return out

    def finish(self) -> list[bytes | bytearray]:
        """The rest of the object: the open block, the index block and the footer."""
        if self._footer is not None:
            raise ValueError("the object is finished")
        if self._next != self._header.last_entry + 1:
            raise ValueError(f"entries {self._next}..{self._header.last_entry} were not added")
        out = self._start()
        if self._count:
            out.append(self._close())
        count = self._next - self._header.first_entry
        index = b"".join((
            _INDEX.pack(INDEX_MAGIC, self._header.first_entry, count, len(self._blocks) // 16, 0),
            self._records,
            self._blocks,
        ))  # fmt: skip
        self._footer = ObjectFooter(
            self._offset, len(index), self._header.ledger_id, count,
            self._offset + len(index) + FOOTER_SIZE, _crc(index),
        )  # fmt: skip
        out += (index, pack_footer(self._footer))
        return out

    def _start(self) -> list[bytes | bytearray]:
        head, self._head = self._head, None
        if head is None:
            return []
        self._offset = len(head)
        return [head]

    def _close(self) -> bytearray:
        count = self._count
        first_id = self._header.first_entry + self._block_first
        _BLOCK.pack_into(self._block, 0, BLOCK_MAGIC, count, first_id)
        block = self._block  # handed on as it is: the next block is a new buffer
        self._blocks += _RECORD.pack(self._offset, len(block), self._block_first)
        self._offset += len(block)
        self._block_first += count
        self._block, self._count = bytearray(BLOCK_HEADER_SIZE), 0
        return block


def pack_run(
    block: bytearray,
    block_size: int,
    records: bytearray,
    offset: int,
    bodies: Sequence[bytes],
    first: int,
) -> int:
    """Add ``bodies[first:]`` to the open ``block`` (its header's room, then each entry's length
    and body) while they fit in ``block_size`` -- a block's first entry always does -- and each
    entry's index record to ``records``: its body's offset (the block is at ``offset`` in the
    object), length and CRC32C. Returns the position of the first body not added; the block is
    full when it holds ``block_size`` bytes or more. (``aiobk.protocol._runs.pack_run`` is its
    compiled twin.)"""
    at = first
    for body in bodies[first:]:
        size = len(body)
        used = len(block)
        if used > BLOCK_HEADER_SIZE and used + _PREFIX.size + size > block_size:
            break
        records += _RECORD.pack(offset + used + _PREFIX.size, size, _crc(body))
        block += _PREFIX.pack(size)
        block += body
        at += 1
        if len(block) >= block_size:
            break
    return at


_compiled_runs = compiled("aiobk.protocol._runs")
_pack_run = _compiled_runs.pack_run if _compiled_runs is not None else pack_run
# Without the compiled module every block takes the checks in ``_block``, and every index
# the checks in ``_check_tiling_pure``.
_check_entries: Callable[[bytes, int, bytes, int, int], bool] = (
    _compiled_runs.check_entries if _compiled_runs is not None else lambda *_args: False
)
_check_tiling: Callable[[bytes, bytes, int, int], bool] = (
    _compiled_runs.check_tiling if _compiled_runs is not None else lambda *_args: False
)


__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "FOOTER_SIZE",
    "INDEX_RECORD_SIZE",
    "DEFAULT_BLOCK_SIZE",
    "BlockLocation",
    "EntryLocation",
    "ObjectEncoder",
    "ObjectFooter",
    "ObjectHeader",
    "ObjectIndex",
    "check_block",
    "check_body",
    "check_footer",
    "index_span",
    "pack_footer",
    "pack_header",
    "parse_block",
    "parse_footer",
    "parse_header",
    "parse_index",
    "parse_locations",
    "parse_object",
    "pack_run",
]
