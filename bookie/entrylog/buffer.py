"""The entry logs on their way to disk: the log taking appends, the in-memory chunks not
written yet, and the open files they are written to.

New records go to an in-memory buffer that is written out when it passes ``write_buffer_size``
and on every checkpoint; reads are served from the buffer while the bytes are not in the file
yet. Only a checkpoint fsyncs: until then the journal holds what the buffer would lose in a
crash (or, for journal-less bookies, BP-46's boot-time fencing and limbo cover it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aiobk.bookie.disk import AppendFile, Disk
from aiobk.bookie.entrylog.format import FILE_MAGIC, log_name
from aiobk.bookie.stats import BookieStats

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Chunk:
    log_id: int
    start: int  # file offset of data[0]
    data: bytearray

    def slice(self, offset: int) -> memoryview | None:
        if self.start <= offset < self.start + len(self.data):
            return memoryview(self.data)[offset - self.start :]
        return None


class LogBuffer:
    def __init__(
        self,
        disk: Disk,
        directory: str,
        write_buffer_size: int,
        stats: BookieStats,
        on_write_error: Callable[[OSError], None] | None,
    ) -> None:
        self._disk = disk
        self._on_write_error = on_write_error  # a full disk turns the bookie read-only
        self._dir = directory
        self._write_buffer_size = write_buffer_size
        self.stats = stats
        self._chunks: deque[Chunk] = deque()  # not yet written; the last one takes appends
        self._writing: Chunk | None = None
        self._writers: dict[int, AppendFile] = {}
        self._unsynced: set[int] = set()
        self._flush_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self.active: Chunk | None = None

    async def start_log(self, log_id: int) -> None:
        self.active = Chunk(log_id, 0, bytearray(FILE_MAGIC))
        self._chunks.append(self.active)

    @property
    def active_log(self) -> int:
        """The id of the log taking appends: every append from now on goes to it or a newer one."""
        active = self.active
        assert active is not None
        return active.log_id

    @property
    def active_size(self) -> int:
        """Bytes in the log taking appends (its file and its buffer)."""
        active = self.active
        assert active is not None
        return active.start + len(active.data)

    def roll(self) -> Chunk:
        """Start the next log; return its chunk, which takes appends from now on."""
        active = self.active
        assert active is not None
        active = Chunk(active.log_id + 1, 0, bytearray(FILE_MAGIC))
        self._chunks.append(active)
        self.active = active
        return active

    def appended(self, size: int) -> None:
        """The active chunk holds ``size`` bytes now: past ``write_buffer_size``, write it out
        in the background."""
        if size >= self._write_buffer_size and self._flush_task is None:
            self._flush_task = asyncio.get_running_loop().create_task(self._background_flush())

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
            active = self.active
            assert active is not None
            if active.data:
                # Seal the active chunk; appends continue in a fresh one after it.
                fresh = Chunk(active.log_id, active.start + len(active.data), bytearray())
                self._chunks.append(fresh)
                self.active = fresh
            while self._chunks and self._chunks[0] is not self.active:
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

    async def _undo_partial_write(self, chunk: Chunk) -> None:
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
            active = self.active
            assert active is not None
            for old in [i for i in self._writers if i < active.log_id]:
                await self._writers.pop(old).close()

    def buffered(self, log_id: int, offset: int) -> memoryview | None:
        """The bytes of a log from ``offset`` on while they are not in its file yet."""
        for chunk in (self._writing, *self._chunks):
            if chunk is not None and chunk.log_id == log_id:
                view = chunk.slice(offset)
                if view is not None:
                    return view
        return None

    def first_buffered(self, log_id: int) -> int | None:
        """The file offset from which a log's bytes are held here, not in its file yet (every
        offset from it on is); None when none are."""
        starts = [c.start for c in (self._writing, *self._chunks) if c and c.log_id == log_id]
        return min(starts) if starts else None

    def buffered_size(self, log_id: int) -> int:
        """Bytes of a log not in its file yet."""
        return sum(len(c.data) for c in (self._writing, *self._chunks) if c and c.log_id == log_id)

    def busy_logs(self) -> set[int]:
        """Logs that hold buffered bytes or are still open for writing."""
        busy = {chunk.log_id for chunk in self._chunks}
        if self._writing is not None:
            busy.add(self._writing.log_id)
        busy.update(self._writers)
        return busy

    def writing(self, log_id: int) -> bool:
        """Whether the file of ``log_id`` is still open for writing (written out, not synced)."""
        return log_id in self._writers

    def check_complete(self, log_id: int) -> None:
        if log_id in self._writers or self.active is None or log_id >= self.active.log_id:
            raise ValueError(f"entry log {log_id:x} is still being written")

    async def close(self) -> None:
        for writer in self._writers.values():
            await writer.close()
        self._writers.clear()
