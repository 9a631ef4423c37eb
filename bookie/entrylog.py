"""Entry logs: append-only files holding the entries of every ledger, interleaved.

Record layout::

    u32 length of what follows the crc | u32 crc32c | i64 ledger id | i64 entry id | body

A location is ``log_id << 40 | offset`` (one int64 per entry in the index). New records go to an
in-memory buffer that is written out when it passes ``write_buffer_size`` and on every
checkpoint; reads are served from the buffer while the bytes are not in the file yet. Only a
checkpoint fsyncs: until then the journal holds what the buffer would lose in a crash (or, for
journal-less bookies, BP-46's boot-time fencing and limbo cover it).

Once a log is complete, garbage collection may want its number of records (compaction's
denominator): counted while appending, or by walking the file once, then kept beside it in
``XXXXXXXX.cnt``; and the bytes each ledger's records take in it (what its report calls live
bytes), tallied while appending and kept in ``XXXXXXXX.lmap`` (pairs of big-endian u64: ledger,
bytes), or found by the same walk.

Every read checks the record's CRC and ids; a mismatch raises ``CorruptEntryError`` so that the
bookie answers EIO instead of serving bad bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import crc32c

from aiobk.bookie.disk import AppendFile, Disk, ReadFile
from aiobk.bookie.stats import BookieStats

log = logging.getLogger(__name__)

RECORD_HEAD = struct.Struct(">IIqq")
IDS = struct.Struct(">qq")
FILE_MAGIC = b"AIOBKLOG\x00\x00\x00\x01"  # 12 bytes: magic and format version
SUFFIX = ".log"
OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1
LENGTH = struct.Struct(">I")
SCAN_BLOCK = 1 << 20  # bytes read at a time when walking a log's records
PAGE = 4096
# An entry read takes the rest of the page its record starts in, or that and the next page when
# under READ_MIN is left: one page from a cold disk for most small records, where a fixed 4 KiB
# from an unaligned offset always spanned two (a record past the guess is read in a second go).
READ_MIN = 1024


class CorruptEntryError(Exception):
    """A stored entry failed its checksum or does not belong where the index says."""


def pack_location(log_id: int, offset: int) -> int:
    return (log_id << OFFSET_BITS) | offset


def unpack_location(location: int) -> tuple[int, int]:
    return location >> OFFSET_BITS, location & OFFSET_MASK


def log_name(log_id: int) -> str:
    return f"{log_id:08x}{SUFFIX}"


def count_name(log_id: int) -> str:
    return f"{log_id:08x}.cnt"


def map_name(log_id: int) -> str:
    return f"{log_id:08x}.lmap"


LEDGER_BYTES = struct.Struct(">QQ")


@dataclass(slots=True)
class _Chunk:
    log_id: int
    start: int  # file offset of data[0]
    data: bytearray

    def slice(self, offset: int) -> memoryview | None:
        if self.start <= offset < self.start + len(self.data):
            return memoryview(self.data)[offset - self.start :]
        return None


class EntryLogger:
    def __init__(
        self,
        disk: Disk,
        directory: str,
        *,
        max_log_size: int,
        write_buffer_size: int,
        stats: BookieStats | None = None,
        on_write_error: Callable[[OSError], None] | None = None,
    ) -> None:
        self._disk = disk
        self._on_write_error = on_write_error  # a full disk turns the bookie read-only
        self._dir = directory
        self._max_log_size = max_log_size
        self._write_buffer_size = write_buffer_size
        self.stats = stats or BookieStats()
        self._chunks: deque[_Chunk] = deque()  # not yet written; the last one takes appends
        self._writing: _Chunk | None = None
        self._writers: dict[int, AppendFile] = {}
        self._readers: dict[int, ReadFile] = {}
        self._unsynced: set[int] = set()
        self._flush_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._active: _Chunk | None = None
        self._active_records = 0  # records appended to the active log in this life
        self._appended: dict[int, int] = {}  # records of the logs this life completed
        self._counts: dict[int, int] = {}  # records in complete logs, as far as known
        self._active_bytes: dict[int, int] = {}  # ledger -> record bytes in the active log
        self._completed_bytes: dict[int, dict[int, int]] = {}  # the same, logs not yet saved

    async def open(self) -> None:
        """Start a new entry log after every existing one (a restart never appends to old logs)."""
        await self._disk.makedirs(self._dir)
        names = await self._disk.listdir(self._dir)
        ids = [int(n[:-4], 16) for n in names if _is_log(n)]
        for name in names:  # a crash mid-removal leaves them: a reused id must not read them
            owner = _side_of(name)
            if owner is not None and log_name(owner) not in names:
                await self._disk.remove(os.path.join(self._dir, name))
        await self._start_log(max(ids, default=-1) + 1)

    async def _start_log(self, log_id: int) -> None:
        self._active = _Chunk(log_id, 0, bytearray(FILE_MAGIC))
        self._chunks.append(self._active)

    @property
    def active_log(self) -> int:
        """The id of the log taking appends: every append from now on goes to it or a newer one."""
        active = self._active
        assert active is not None
        return active.log_id

    @property
    def active_size(self) -> int:
        """Bytes in the log taking appends (its file and its buffer)."""
        active = self._active
        assert active is not None
        return active.start + len(active.data)

    def roll(self) -> _Chunk:
        """Start the next log: the one taking appends so far becomes complete (garbage
        collection can only remove or compact complete logs)."""
        active = self._active
        assert active is not None
        self._appended[active.log_id] = self._active_records  # complete: its count is final
        self._active_records = 0
        self._completed_bytes[active.log_id], self._active_bytes = self._active_bytes, {}
        active = _Chunk(active.log_id + 1, 0, bytearray(FILE_MAGIC))
        self._chunks.append(active)
        self._active = active
        return active

    def append(self, ledger_id: int, entry_id: int, body: bytes) -> int:
        """Buffer one entry; return its location."""
        return self.append_many(ledger_id, ((entry_id, body),))[0]

    def append_many(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> list[int]:
        """Buffer the entries of one ledger, in order (an ADD_BATCH's), rolling to a new log
        where the next would not fit; return their locations."""
        locations: list[int] = []
        active = self._active
        assert active is not None
        max_size = self._max_log_size
        head_size = RECORD_HEAD.size
        pack_head, pack_ids, crc = RECORD_HEAD.pack, IDS.pack, crc32c.crc32c
        data = active.data
        added = 0  # record bytes of this ledger in the active log, tallied once per call
        for entry_id, body in entries:
            size = head_size + len(body)
            offset = active.start + len(data)
            if offset + size > max_size and offset > len(FILE_MAGIC):
                self._tally(ledger_id, added)
                added = 0
                active = self.roll()
                data = active.data
                offset = len(FILE_MAGIC)
            added += size
            checksum = crc(body, crc(pack_ids(ledger_id, entry_id)))
            data += pack_head(size - 8, checksum, ledger_id, entry_id)
            data += body
            locations.append(active.log_id << OFFSET_BITS | offset)  # pack_location, inlined
        self._active_records += len(entries)
        self._tally(ledger_id, added)
        if len(data) >= self._write_buffer_size and self._flush_task is None:
            self._flush_task = asyncio.get_running_loop().create_task(self._background_flush())
        return locations

    def _tally(self, ledger_id: int, size: int) -> None:
        if size:
            tally = self._active_bytes
            tally[ledger_id] = tally.get(ledger_id, 0) + size

    async def _background_flush(self) -> None:
        try:
            await self.flush()
        except OSError as exc:
            # The bytes stay buffered (reads still find them); the next flush or checkpoint
            # tries again, and a checkpoint that cannot write keeps the journal. On a full
            # disk the bookie turns read-only, so the buffer stops growing.
            log.warning("entry log write failed, kept in memory for the next flush: %s", exc)
            if self._on_write_error is not None:
                self._on_write_error(exc)
        finally:
            self._flush_task = None

    async def flush(self) -> None:
        """Write every buffered byte to its file (no fsync)."""
        async with self._flush_lock:
            active = self._active
            assert active is not None
            if active.data:
                # Seal the active chunk; appends continue in a fresh one after it.
                fresh = _Chunk(active.log_id, active.start + len(active.data), bytearray())
                self._chunks.append(fresh)
                self._active = fresh
            while self._chunks and self._chunks[0] is not self._active:
                chunk = self._chunks[0]
                self._writing = chunk
                self._chunks.popleft()
                try:
                    writer = await self._writer(chunk.log_id)
                    await writer.write(bytes(chunk.data))
                except BaseException:
                    self._chunks.appendleft(chunk)
                    await self._undo_partial_write(chunk)
                    raise
                finally:
                    self._writing = None
                self._unsynced.add(chunk.log_id)
                self.stats.entry_log_flushes += 1
                await self._retire_writers(chunk.log_id)

    async def _writer(self, log_id: int) -> AppendFile:
        writer = self._writers.get(log_id)
        if writer is None:
            path = os.path.join(self._dir, log_name(log_id))
            writer = await self._disk.open_append(path, "storage")
            self._writers[log_id] = writer
        return writer

    async def _undo_partial_write(self, chunk: _Chunk) -> None:
        """After a failed write (a full disk may take half of it), cut the file back to where
        the chunk starts and reopen it on the next try: locations are offsets, so a retry
        appended after a partial write would put every later record where none is expected."""
        writer = self._writers.pop(chunk.log_id, None)
        with contextlib.suppress(Exception):
            if writer is not None:
                await writer.close()
            path = os.path.join(self._dir, log_name(chunk.log_id))
            if await self._disk.exists(path):
                await self._disk.truncate(path, chunk.start)

    async def _retire_writers(self, log_id: int) -> None:
        """Close writers of logs older than ``log_id`` once they are synced."""
        for old in [i for i in self._writers if i < log_id and i not in self._unsynced]:
            await self._writers.pop(old).close()

    async def sync(self) -> None:
        """Flush, then fsync every log written since the last sync (a checkpoint's first step)."""
        await self.flush()
        async with self._flush_lock:
            for log_id in sorted(self._unsynced):
                await self._writers[log_id].sync()
                self.stats.storage_syncs += 1
            self._unsynced.clear()
            active = self._active
            assert active is not None
            for old in [i for i in self._writers if i < active.log_id]:
                await self._writers.pop(old).close()

    def _buffered(self, log_id: int, offset: int) -> memoryview | None:
        for chunk in (self._writing, *self._chunks):
            if chunk is not None and chunk.log_id == log_id:
                view = chunk.slice(offset)
                if view is not None:
                    return view
        return None

    async def read(self, location: int, ledger_id: int, entry_id: int) -> bytes:
        """The body stored at ``location``, checked against its CRC and expected ids."""
        log_id, offset = unpack_location(location)
        view = self._buffered(log_id, offset)
        if view is not None:
            head = bytes(view[: RECORD_HEAD.size])
            length = RECORD_HEAD.unpack_from(head)[0]
            record = bytes(view[: 8 + length])
        else:
            reader = await self._reader(log_id)
            guess = PAGE - offset % PAGE
            record = await reader.pread(offset, guess if guess >= READ_MIN else guess + PAGE)
            if len(record) < RECORD_HEAD.size:
                raise CorruptEntryError(f"entry log {log_id:x} is truncated at {offset}")
            size = 8 + RECORD_HEAD.unpack_from(record)[0]
            if size > len(record):  # a big entry: the rest of it
                record += await reader.pread(offset + len(record), size - len(record))
            else:
                record = record[:size]
        return _check(record, log_id, offset, ledger_id, entry_id, self.stats)

    async def _reader(self, log_id: int) -> ReadFile:
        reader = self._readers.get(log_id)
        if reader is None:
            path = os.path.join(self._dir, log_name(log_id))
            try:
                reader = await self._disk.open_read(path)
            except FileNotFoundError:
                raise CorruptEntryError(f"entry log {log_id:x} is missing") from None
            self._readers[log_id] = reader
        return reader

    async def complete_logs(self, older_than: int) -> list[int]:
        """Entry logs on disk that take no more appends and hold no buffered bytes, of those
        older than ``older_than`` (an ``active_log`` noted earlier: garbage collection takes
        only the logs whose every entry its checkpoint's index names)."""
        active = self._active
        assert active is not None
        busy = {chunk.log_id for chunk in self._chunks}
        if self._writing is not None:
            busy.add(self._writing.log_id)
        busy.update(self._writers)
        names = await self._disk.listdir(self._dir)
        ids = (int(name[:-4], 16) for name in names if _is_log(name))
        limit = min(older_than, active.log_id)
        return sorted(i for i in ids if i < limit and i not in busy)

    async def remove_log(self, log_id: int) -> int:
        """Delete a complete entry log (garbage collection); return its size in bytes."""
        self._check_complete(log_id)
        path = os.path.join(self._dir, log_name(log_id))
        reader = self._readers.pop(log_id, None)
        if reader is None:
            reader = await self._disk.open_read(path)
        try:
            size = await reader.size()
        finally:
            await reader.close()
        await self._disk.remove(path)
        for side in (count_name(log_id), map_name(log_id)):
            with contextlib.suppress(FileNotFoundError):  # never written, or removed meanwhile
                await self._disk.remove(os.path.join(self._dir, side))
        self._counts.pop(log_id, None)
        self._appended.pop(log_id, None)
        self._completed_bytes.pop(log_id, None)
        return size

    async def record_count(self, log_id: int) -> int:
        """How many records a complete entry log holds (compaction's denominator): counted
        while appending in this life, else from its ``.cnt`` file, else by scanning it once
        (then kept in a ``.cnt`` file; a log never changes once complete)."""
        self._check_complete(log_id)
        count = self._counts.get(log_id)
        if count is not None:
            return count
        path = os.path.join(self._dir, count_name(log_id))
        if await self._disk.exists(path):
            text = (await self._disk.read_file(path)).decode(errors="replace")
            count = int(text) if text.isdigit() else None
        if count is None:
            count = self._appended.get(log_id)
            if count is None:
                count, sizes = await self._scan(log_id)
                await self._save_map(log_id, sizes)
            await self._disk.write_file_atomic(path, str(count).encode())
        self._counts[log_id] = count
        return count

    async def known_record_count(self, log_id: int) -> int | None:
        """``record_count`` when it is known without walking the log (None otherwise); the
        active log's records appended so far."""
        if self._active is not None and log_id == self._active.log_id:
            return self._active_records
        count = self._counts.get(log_id, self._appended.get(log_id))
        if count is not None:
            return count
        path = os.path.join(self._dir, count_name(log_id))
        if await self._disk.exists(path):
            text = (await self._disk.read_file(path)).decode(errors="replace")
            return int(text) if text.isdigit() else None
        return None

    async def ledger_bytes(self, log_id: int, *, scan: bool = False) -> dict[int, int] | None:
        """Record bytes per ledger in a log: the active one's so far; a complete one's from
        this life's tally (then saved beside it), its ``.lmap`` file, or -- with ``scan`` -- a
        walk of the log (then saved); None when not known without one."""
        if self._active is not None and log_id == self._active.log_id:
            return dict(self._active_bytes)
        tallied = self._completed_bytes.get(log_id)
        if log_id in self._writers:  # still being written out: not saved yet
            return None if tallied is None else dict(tallied)
        self._check_complete(log_id)
        if tallied is not None:
            await self._save_map(log_id, tallied)
            return dict(tallied)
        saved = await self._read_map(log_id)
        if saved is not None or not scan:
            return saved
        count, sizes = await self._scan(log_id)
        await self._save_map(log_id, sizes)
        if log_id not in self._counts:
            await self._disk.write_file_atomic(
                os.path.join(self._dir, count_name(log_id)), str(count).encode()
            )
            self._counts[log_id] = count
        return sizes

    async def known_ledger_bytes(self, log_id: int) -> dict[int, int] | None:
        """``ledger_bytes`` as far as known without walking the log, and without writing
        anything (what a report reads, also on a full disk and while a pass runs)."""
        if self._active is not None and log_id == self._active.log_id:
            return dict(self._active_bytes)
        tallied = self._completed_bytes.get(log_id)
        if tallied is not None:
            return dict(tallied)
        return await self._read_map(log_id)

    async def _read_map(self, log_id: int) -> dict[int, int] | None:
        path = os.path.join(self._dir, map_name(log_id))
        if not await self._disk.exists(path):
            return None
        data = await self._disk.read_file(path)
        usable = len(data) - len(data) % LEDGER_BYTES.size
        return dict(LEDGER_BYTES.iter_unpack(data[:usable]))

    async def _save_map(self, log_id: int, sizes: dict[int, int]) -> None:
        data = b"".join(LEDGER_BYTES.pack(ledger, size) for ledger, size in sorted(sizes.items()))
        await self._disk.write_file_atomic(os.path.join(self._dir, map_name(log_id)), data)
        self._completed_bytes.pop(log_id, None)  # on disk now: no longer held in memory

    async def log_size(self, log_id: int) -> int:
        """Bytes a log takes: its file, and for the active log its buffer too."""
        active = self._active
        if active is not None and log_id == active.log_id:
            return self.active_size
        buffered = sum(
            len(c.data) for c in (self._writing, *self._chunks) if c and c.log_id == log_id
        )
        return await (await self._reader(log_id)).size() + buffered

    async def log_ids(self) -> list[int]:
        """Every entry log on disk, and the active one, ascending."""
        names = await self._disk.listdir(self._dir)
        ids = {int(name[:-4], 16) for name in names if _is_log(name)}
        return sorted(ids | {self.active_log})

    async def _scan(self, log_id: int) -> tuple[int, dict[int, int]]:
        """Count the records of a log, and their bytes per ledger, by walking their heads a
        block at a time; a torn tail (a crash mid-write) ends the walk."""
        reader = await self._reader(log_id)
        size = await reader.size()
        offset, count = len(FILE_MAGIC), 0
        sizes: dict[int, int] = {}
        block, block_start = b"", offset
        while offset + RECORD_HEAD.size <= size:
            at = offset - block_start
            if at + RECORD_HEAD.size > len(block):
                block, block_start, at = await reader.pread(offset, SCAN_BLOCK), offset, 0
                if len(block) < RECORD_HEAD.size:
                    break
            length, _crc, ledger_id, _entry_id = RECORD_HEAD.unpack_from(block, at)
            end = offset + 8 + length
            if length < IDS.size or end > size:
                break
            count += 1
            sizes[ledger_id] = sizes.get(ledger_id, 0) + 8 + length
            offset = end
        return count, sizes

    async def records(self, log_id: int) -> AsyncIterator[tuple[int, int, int, bytes]]:
        """(offset, ledger, entry, body) of every record of a complete log, in file order, a
        block at a time (compaction's walk, BookKeeper's scanEntryLog). A record failing its
        checksum is skipped with a warning; a torn tail ends the walk."""
        self._check_complete(log_id)
        reader = await self._reader(log_id)
        size = await reader.size()
        offset = len(FILE_MAGIC)
        block, block_start = b"", offset
        while offset + RECORD_HEAD.size <= size:
            at = offset - block_start
            if at + RECORD_HEAD.size > len(block):
                block, block_start, at = await reader.pread(offset, SCAN_BLOCK), offset, 0
            length, _crc, ledger_id, entry_id = RECORD_HEAD.unpack_from(block, at)
            end = offset + 8 + length
            if length < IDS.size or end > size:
                return
            if at + 8 + length > len(block):
                want = max(SCAN_BLOCK, 8 + length)
                block, block_start, at = await reader.pread(offset, want), offset, 0
            record = block[at : at + 8 + length]
            try:
                body = _check(record, log_id, offset, ledger_id, entry_id, self.stats)
            except CorruptEntryError as exc:
                log.warning("%s; skipped", exc)
            else:
                yield offset, ledger_id, entry_id, body
            offset = end

    def _check_complete(self, log_id: int) -> None:
        if log_id in self._writers or self._active is None or log_id >= self._active.log_id:
            raise ValueError(f"entry log {log_id:x} is still being written")

    async def close(self) -> None:
        for writer in self._writers.values():
            await writer.close()
        for reader in self._readers.values():
            await reader.close()
        self._writers.clear()
        self._readers.clear()


def _check(
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


def _side_of(name: str) -> int | None:
    """The log id a ``.cnt`` or ``.lmap`` file belongs to; None for any other name."""
    stem, _dot, suffix = name.partition(".")
    if suffix in ("cnt", "lmap") and len(stem) == 8 and all(c in "0123456789abcdef" for c in stem):
        return int(stem, 16)
    return None


def _is_log(name: str) -> bool:
    return (
        name.endswith(SUFFIX) and len(name) == 12 and all(c in "0123456789abcdef" for c in name[:8])
    )
