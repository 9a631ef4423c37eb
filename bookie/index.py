"""The checkpointed ledger index: ledger states and entry locations, in segment files.

A checkpoint writes one segment ``index/SEQ.idx`` (tmp file, fsync, rename, directory fsync, so
a segment either exists whole or not at all). A segment is FULL (every ledger, every page) or a
DELTA (ledgers and pages changed since the previous segment) and records the journal LSN it
covers: a restart loads the last FULL segment and the DELTAs after it, then replays the journal
from that LSN. Every ``full_every`` checkpoints a FULL segment replaces the older ones.

Layout, big-endian but for the pages (little-endian int64 arrays)::

    header  b"AIOBKIDX" | u32 version | u8 kind | u64 seq | i64 journal LSN | u32 ledgers
    ledger  i64 id | u8 flags | u8 key length | key | i64 lac | i64 max entry | u32 pages
    page    u32 page number | 4096 x i64 location
    trailer u32 crc32c of everything before it
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import crc32c

from bookie.disk import Disk
from bookie.ledger import PAGE_SIZE, LedgerState

MAGIC = b"AIOBKIDX"
VERSION = 1
HEADER = struct.Struct(">8sIBQqI")
KIND_OFFSET = 12
LEDGER = struct.Struct(">qBB")
LEDGER_TAIL = struct.Struct(">qqI")
PAGE_HEAD = struct.Struct(">I")
PAGE_BYTES = PAGE_SIZE * 8
CRC = struct.Struct(">I")
SUFFIX = ".idx"
FULL, DELTA = 1, 2
FENCED, LIMBO = 1, 2


class IndexCorruptError(Exception):
    """An index segment is damaged; the bookie must not guess what it held."""


@dataclass(slots=True)
class Snapshot:
    """What a checkpoint captured, encoded, ready to be written after the entry logs sync."""

    seq: int
    full: bool
    data: bytes


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


def encode_segment(
    seq: int, full: bool, mark_lsn: int, ledgers: Iterable[LedgerState]
) -> tuple[bytes, int]:
    """Encode (and clear the dirty marks of) what a segment holds; return bytes and count."""
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
            parts.append(PAGE_HEAD.pack(number))
            parts.append(_page_bytes(state.pages[number]))
        state.dirty_pages.clear()
        state.meta_dirty = False
    header = HEADER.pack(MAGIC, VERSION, FULL if full else DELTA, seq, mark_lsn, count)
    body = b"".join([header, *parts])
    return body + CRC.pack(crc32c.crc32c(body)), count


def decode_segment(data: bytes, ledgers: dict[int, LedgerState]) -> tuple[int, int, int]:
    """Apply a segment to ``ledgers``; return (kind, seq, journal LSN)."""
    if len(data) < HEADER.size + CRC.size:
        raise IndexCorruptError("index segment is shorter than its header")
    (crc,) = CRC.unpack_from(data, len(data) - CRC.size)
    if crc32c.crc32c(data[: -CRC.size]) != crc:
        raise IndexCorruptError("index segment checksum mismatch")
    magic, version, kind, seq, mark, count = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or kind not in (FULL, DELTA):
        raise IndexCorruptError("index segment header is not recognised")
    if kind == FULL:
        ledgers.clear()
    offset = HEADER.size
    try:
        for _ in range(count):
            ledger_id, flags, key_length = LEDGER.unpack_from(data, offset)
            offset += LEDGER.size
            key = data[offset : offset + key_length]
            offset += key_length
            lac, max_entry, pages = LEDGER_TAIL.unpack_from(data, offset)
            offset += LEDGER_TAIL.size
            state = ledgers.get(ledger_id)
            if state is None:
                state = ledgers[ledger_id] = LedgerState(ledger_id, key)
            state.master_key = key
            state.fenced = bool(flags & FENCED)
            state.limbo = bool(flags & LIMBO)
            state.lac = lac
            for _page in range(pages):
                (number,) = PAGE_HEAD.unpack_from(data, offset)
                offset += PAGE_HEAD.size
                page = _page_from(data[offset : offset + PAGE_BYTES])
                offset += PAGE_BYTES
                state.pages[number] = page
            state.max_entry = max(state.max_entry, max_entry)
            state.meta_dirty = False
    except struct.error as exc:
        raise IndexCorruptError(f"index segment is truncated: {exc}") from None
    if offset != len(data) - CRC.size:
        raise IndexCorruptError("index segment has trailing bytes")
    return kind, seq, mark


class IndexStore:
    def __init__(self, disk: Disk, directory: str, full_every: int) -> None:
        self._disk = disk
        self._dir = directory
        self._full_every = full_every
        self._seq = 0
        self._since_full = 0
        self._force_full = True
        self._segments: list[str] = []

    async def load(self) -> tuple[int, dict[int, LedgerState]]:
        """Ledger states and the journal LSN they cover (-1 with nothing checkpointed)."""
        await self._disk.makedirs(self._dir)
        names = []
        for name in await self._disk.listdir(self._dir):
            if name.endswith(".tmp"):
                await self._disk.remove(os.path.join(self._dir, name))
            elif name.endswith(SUFFIX):
                names.append(name)
        names.sort()
        ledgers: dict[int, LedgerState] = {}
        mark = -1
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
                kind, seq, mark = decode_segment(data, ledgers)
            except IndexCorruptError as exc:
                raise IndexCorruptError(f"{name}: {exc}") from None
            if kind == FULL and name != names[start]:  # pragma: no cover - defensive
                raise IndexCorruptError(f"{name}: unexpected full segment")
            self._seq = seq
        self._segments = names[start:]
        self._since_full = len(self._segments)
        self._force_full = not names
        return mark, ledgers

    def capture(self, mark_lsn: int, ledgers: Iterable[LedgerState]) -> Snapshot:
        """Encode a segment now (synchronously, so it matches the entry logs' state now)."""
        full = self._force_full or self._since_full >= self._full_every
        self._seq += 1
        data, _count = encode_segment(self._seq, full, mark_lsn, ledgers)
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
