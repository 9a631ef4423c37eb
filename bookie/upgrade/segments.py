"""The index format of aiobk before the on-disk index (read to upgrade a data directory; the
bookie now keeps its index in ``bookie.index.entry_index``): ledger states and entry locations, in
segment files.

``PagedLedger`` is that format's in-memory ledger: locations in pages of 4096 slots, like
BookKeeper's index pages, sparse (a dict) until ``SPARSE_MAX`` entries, then dense (4096 int64
slots). ``bookie.upgrade.convert`` loads the segments into these and writes them to the new index.

A checkpoint writes one segment ``index/SEQ.idx`` (tmp file, fsync, rename, directory fsync, so
a segment either exists whole or not at all). A segment is FULL (every ledger, every page) or a
DELTA (ledgers and pages changed since the previous segment) and records the journal LSN it
covers: a restart loads the last FULL segment and the DELTAs after it, then replays the journal
from that LSN. Every ``full_every`` checkpoints a FULL segment replaces the older ones.

Layout (version 2), big-endian but for dense pages (little-endian int64 arrays)::

    header  b"AIOBKIDX" | u32 version | u8 kind | u64 seq | i64 journal LSN | u32 ledgers
    ledger  i64 id | u8 flags | u8 key length | key | i64 lac | i64 max entry | u32 pages
    page    u64 page number | u16 entries | dense (entries = 0): 4096 x i64 location
                                          | sparse: entries x (u16 slot | i64 location)
    deleted u32 count | count x i64 ledger id     (ledgers garbage collection dropped; FULL only)
    trailer u32 crc32c of everything before it

Version 1 (read, for upgrades; the next checkpoint writes version 2) had u32 page numbers, dense
pages only and no deleted list. Every field is as wide as what the protocol lets a peer send
(``protocol.limits``), so encoding a state the bookie holds cannot fail.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

import crc32c

from aiobk.bookie.disk import Disk
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.bookie.ledger_state import MAX_KEY_SIZE

PAGE_BITS = 12
PAGE_SIZE = 1 << PAGE_BITS
PAGE_MASK = PAGE_SIZE - 1
_EMPTY_PAGE = array("q", [-1]) * PAGE_SIZE
# A sparse page turns dense at this many entries: measured, a dict of 256 locations takes
# 23 KiB (with its int objects), 360 would match the 32 KiB array.
SPARSE_MAX = 256

# Dense: slot -> location (-1 absent); sparse: only the slots present.
Page: TypeAlias = "array[int] | dict[int, int]"

MAGIC = b"AIOBKIDX"
VERSION = 2
HEADER = struct.Struct(">8sIBQqI")
KIND_OFFSET = 12
LEDGER = struct.Struct(">qBB")
LEDGER_TAIL = struct.Struct(">qqI")
PAGE_HEAD_V1 = struct.Struct(">I")
PAGE_HEAD = struct.Struct(">QH")
SLOT = struct.Struct(">Hq")
COUNT = struct.Struct(">I")
LEDGER_ID = struct.Struct(">q")
PAGE_BYTES = PAGE_SIZE * 8
CRC = struct.Struct(">I")
SUFFIX = ".idx"
FULL, DELTA = 1, 2
FENCED, LIMBO = 1, 2


def dense_page(sparse: dict[int, int]) -> array[int]:
    page = array("q", _EMPTY_PAGE)
    for slot, location in sparse.items():
        page[slot] = location
    return page


def page_items(page: Page) -> Iterator[tuple[int, int]]:
    """(slot, location) of every entry a page holds."""
    if isinstance(page, dict):
        return iter(page.items())
    return ((slot, location) for slot, location in enumerate(page) if location >= 0)


class PagedLedger:
    """One ledger as format 2 holds it: state and paged locations."""

    __slots__ = (
        "dirty_pages",
        "fenced",
        "lac",
        "ledger_id",
        "limbo",
        "master_key",
        "max_entry",
        "meta_dirty",
        "pages",
    )

    def __init__(self, ledger_id: int, master_key: bytes) -> None:
        if len(master_key) > MAX_KEY_SIZE:
            raise ValueError(f"master key of {len(master_key)} bytes exceeds {MAX_KEY_SIZE}")
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.fenced = False
        self.limbo = False
        self.lac = -1
        self.max_entry = -1
        self.pages: dict[int, Page] = {}
        self.dirty_pages: set[int] = set()
        self.meta_dirty = True

    def location(self, entry_id: int) -> int:
        page = self.pages.get(entry_id >> PAGE_BITS)
        if page is None:
            return -1
        if isinstance(page, dict):
            return page.get(entry_id & PAGE_MASK, -1)
        return page[entry_id & PAGE_MASK]

    def set_location(self, entry_id: int, location: int) -> None:
        number = entry_id >> PAGE_BITS
        slot = entry_id & PAGE_MASK
        page = self.pages.get(number)
        if page is None:
            self.pages[number] = {slot: location}
        elif isinstance(page, dict):
            page[slot] = location
            if len(page) >= SPARSE_MAX:
                self.pages[number] = dense_page(page)
        else:
            page[slot] = location
        self.dirty_pages.add(number)
        self.max_entry = max(self.max_entry, entry_id)

    def entries(self) -> Iterator[tuple[int, int]]:
        """(entry, location) of every entry held, ascending."""
        for number in sorted(self.pages):
            base = number << PAGE_BITS
            for slot, location in sorted(page_items(self.pages[number])):
                yield base + slot, location


@dataclass(slots=True)
class Snapshot:
    """What a checkpoint captured, encoded, ready to be written after the entry logs sync."""

    seq: int
    full: bool
    data: bytes


@dataclass(slots=True)
class Loaded:
    """What the segments on disk hold."""

    mark: int = -1  # the journal LSN they cover
    ledgers: dict[int, PagedLedger] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)


def _page_bytes(page: array[int]) -> bytes:
    if sys.byteorder == "little":
        return page.tobytes()
    swapped = array("q", page)  # pragma: no cover - big-endian hosts
    swapped.byteswap()  # pragma: no cover
    return swapped.tobytes()  # pragma: no cover


def _page_from(data: bytes) -> array[int]:
    page = array("q")
    page.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        page.byteswap()
    return page


def _encode_page(parts: list[bytes], number: int, page: Page) -> None:
    if isinstance(page, dict):
        parts.append(PAGE_HEAD.pack(number, len(page)))
        parts.extend(SLOT.pack(slot, location) for slot, location in sorted(page.items()))
    else:
        parts.append(PAGE_HEAD.pack(number, 0))
        parts.append(_page_bytes(page))


def encode_segment(
    seq: int,
    full: bool,
    mark_lsn: int,
    ledgers: Iterable[PagedLedger],
    deleted: Iterable[int] = (),
) -> tuple[bytes, int]:
    """Encode (and clear the dirty marks of) what a segment holds; return bytes and count.
    ``deleted`` (the ids garbage collection dropped) is written in FULL segments only: a drop
    always makes the next segment FULL."""
    parts: list[bytes] = []
    count = 0
    for state in ledgers:
        pages = sorted(state.pages) if full else sorted(state.dirty_pages)
        if not (full or pages or state.meta_dirty):
            continue
        count += 1
        flags = (FENCED if state.fenced else 0) | (LIMBO if state.limbo else 0)
        parts.append(LEDGER.pack(state.ledger_id, flags, len(state.master_key)))
        parts.append(state.master_key)
        parts.append(LEDGER_TAIL.pack(state.lac, state.max_entry, len(pages)))
        for number in pages:
            _encode_page(parts, number, state.pages[number])
        state.dirty_pages.clear()
        state.meta_dirty = False
    gone = sorted(deleted) if full else []
    parts.append(COUNT.pack(len(gone)))
    parts.extend(LEDGER_ID.pack(ledger_id) for ledger_id in gone)
    header = HEADER.pack(MAGIC, VERSION, FULL if full else DELTA, seq, mark_lsn, count)
    body = b"".join([header, *parts])
    return body + CRC.pack(crc32c.crc32c(body)), count


class _Reader:
    """Reads fields from a segment's bytes; running past the end is corruption."""

    __slots__ = ("data", "end", "offset")

    def __init__(self, data: bytes, offset: int, end: int) -> None:
        self.data, self.offset, self.end = data, offset, end

    def take(self, size: int) -> bytes:
        if self.offset + size > self.end:
            raise IndexCorruptError("index segment is truncated")
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        end = self.offset + layout.size
        if end > self.end:
            raise IndexCorruptError("index segment is truncated")
        values = layout.unpack_from(self.data, self.offset)
        self.offset = end
        return values


def _decode_page(reader: _Reader, version: int) -> tuple[int, Page]:
    if version == 1:
        (number,) = reader.unpack(PAGE_HEAD_V1)
        return number, _page_from(reader.take(PAGE_BYTES))
    number, entries = reader.unpack(PAGE_HEAD)
    if entries == 0:
        return number, _page_from(reader.take(PAGE_BYTES))
    sparse: dict[int, int] = {}
    for _ in range(entries):
        slot, location = reader.unpack(SLOT)
        if slot >= PAGE_SIZE:
            raise IndexCorruptError(f"index page slot {slot} is out of range")
        sparse[slot] = location
    return number, sparse


def decode_segment(data: bytes, loaded: Loaded) -> tuple[int, int]:
    """Apply a segment to ``loaded``; return (kind, seq) and set its journal LSN."""
    if len(data) < HEADER.size + CRC.size:
        raise IndexCorruptError("index segment is shorter than its header")
    (crc,) = CRC.unpack_from(data, len(data) - CRC.size)
    if crc32c.crc32c(data[: -CRC.size]) != crc:
        raise IndexCorruptError("index segment checksum mismatch")
    magic, version, kind, seq, mark, count = HEADER.unpack_from(data)
    if magic != MAGIC or version not in (1, VERSION) or kind not in (FULL, DELTA):
        raise IndexCorruptError("index segment header is not recognised")
    ledgers = loaded.ledgers
    if kind == FULL:
        ledgers.clear()
        loaded.deleted.clear()
    reader = _Reader(data, HEADER.size, len(data) - CRC.size)
    for _ in range(count):
        ledger_id, flags, key_length = reader.unpack(LEDGER)
        key = reader.take(key_length)
        lac, max_entry, pages = reader.unpack(LEDGER_TAIL)
        state = ledgers.get(ledger_id)
        if state is None:
            state = ledgers[ledger_id] = PagedLedger(ledger_id, key)
        state.master_key = key
        state.fenced = bool(flags & FENCED)
        state.limbo = bool(flags & LIMBO)
        state.lac = lac
        for _page in range(pages):
            number, page = _decode_page(reader, version)
            state.pages[number] = page
        state.max_entry = max(state.max_entry, max_entry)
        state.meta_dirty = False
    if version >= 2:
        (gone,) = reader.unpack(COUNT)
        for _ in range(gone):
            loaded.deleted.add(reader.unpack(LEDGER_ID)[0])
    if reader.offset != reader.end:
        raise IndexCorruptError("index segment has trailing bytes")
    loaded.mark = mark
    return kind, seq


class IndexStore:
    def __init__(self, disk: Disk, directory: str, full_every: int) -> None:
        self._disk = disk
        self._dir = directory
        self._full_every = full_every
        self._seq = 0
        self._since_full = 0
        self._force_full = True
        self._segments: list[str] = []

    async def load(self) -> Loaded:
        """Ledger states, dropped ledgers and the journal LSN they cover (-1: nothing yet)."""
        await self._disk.makedirs(self._dir)
        names = []
        for name in await self._disk.listdir(self._dir):
            if name.endswith(".tmp"):
                await self._disk.remove(os.path.join(self._dir, name))
            elif name.endswith(SUFFIX):
                names.append(name)
        names.sort()
        loaded = Loaded()
        start = 0
        for position, name in enumerate(names):
            handle = await self._disk.open_read(os.path.join(self._dir, name))
            try:
                head = await handle.pread(0, HEADER.size)
            finally:
                await handle.close()
            if len(head) == HEADER.size and head[KIND_OFFSET] == FULL:
                start = position
        for name in names[start:]:
            data = await self._disk.read_file(os.path.join(self._dir, name))
            try:
                kind, seq = decode_segment(data, loaded)
            except IndexCorruptError as exc:
                raise IndexCorruptError(f"{name}: {exc}") from None
            if kind == FULL and name != names[start]:  # pragma: no cover - defensive
                raise IndexCorruptError(f"{name}: unexpected full segment")
            self._seq = seq
        self._segments = names[start:]
        self._since_full = len(self._segments)
        self._force_full = not names
        return loaded

    def capture(
        self, mark_lsn: int, ledgers: Iterable[PagedLedger], deleted: Iterable[int] = ()
    ) -> Snapshot:
        """Encode a segment now (synchronously, so it matches the entry logs' state now)."""
        full = self._force_full or self._since_full >= self._full_every
        self._seq += 1
        data, _count = encode_segment(self._seq, full, mark_lsn, ledgers, deleted)
        return Snapshot(self._seq, full, data)

    async def write(self, snapshot: Snapshot) -> None:
        name = f"{snapshot.seq:016x}{SUFFIX}"
        try:
            await self._disk.write_file_atomic(os.path.join(self._dir, name), snapshot.data)
        except BaseException:
            self._force_full = True  # the dirty marks were cleared for a segment that is lost
            raise
        if snapshot.full:
            old, self._segments = self._segments, [name]
            for stale in old:
                await self._disk.remove(os.path.join(self._dir, stale))
            self._since_full = 1
            self._force_full = False
        else:
            self._segments.append(name)
            self._since_full += 1

    def require_full(self) -> None:
        """The next segment must hold everything (a ledger was dropped: a delta cannot say so)."""
        self._force_full = True

    def abandon(self) -> None:
        """A captured snapshot will not be written: the next one must be full."""
        self._force_full = True


__all__ = [
    "IndexCorruptError",
    "IndexStore",
    "Loaded",
    "PagedLedger",
    "decode_segment",
    "encode_segment",
    "page_items",
]
