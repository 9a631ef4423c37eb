"""The entry logger: what the bookie's storage, garbage collection and compaction call to
append entries, read them back and let whole logs go. It wires three parts that each own one
thing -- the logs on their way to disk (``buffer``), reading them (``reads``), and the counts
garbage collection keeps of each (``tallies``) -- and does itself only what spans them:
appending (a record lands in the buffer and is tallied; a full log rolls over), the listing of
the logs on disk, and removing one. The record format is ``bookie.entrylog.format``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence

from aiobk.bookie import record_codecs
from aiobk.bookie.disk import Disk
from aiobk.bookie.entrylog.buffer import Chunk, LogBuffer
from aiobk.bookie.entrylog.format import (
    OFFSET_BITS,
    count_name,
    is_log,
    log_name,
    map_name,
    side_of,
)
from aiobk.bookie.entrylog.reads import EntryReader
from aiobk.bookie.entrylog.tallies import LogTallies
from aiobk.bookie.stats import BookieStats


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
        self._dir = directory
        self._max_log_size = max_log_size
        self.stats = stats = stats or BookieStats()
        self._buffer = LogBuffer(disk, directory, write_buffer_size, stats, on_write_error)
        self._reads = EntryReader(disk, directory, self._buffer, stats)
        self._tallies = LogTallies(disk, directory, self._buffer, self._reads)

    async def open(self) -> None:
        """Start a new entry log after every existing one (a restart never appends to old logs)."""
        await self._disk.makedirs(self._dir)
        names = await self._disk.listdir(self._dir)
        ids = [int(n[:-4], 16) for n in names if is_log(n)]
        for name in names:  # a crash mid-removal leaves them: a reused id must not read them
            owner = side_of(name)
            if owner is not None and log_name(owner) not in names:
                await self._disk.remove(os.path.join(self._dir, name))
        await self._buffer.start_log(max(ids, default=-1) + 1)

    @property
    def active_log(self) -> int:
        """The id of the log taking appends: every append from now on goes to it or a newer one."""
        return self._buffer.active_log

    @property
    def active_size(self) -> int:
        """Bytes in the log taking appends (its file and its buffer)."""
        return self._buffer.active_size

    def roll(self) -> Chunk:
        """Start the next log: the one taking appends so far becomes complete (garbage
        collection can only remove or compact complete logs)."""
        self._tallies.complete(self._buffer.active_log)
        return self._buffer.roll()

    def append(self, ledger_id: int, entry_id: int, body: bytes) -> int:
        """Buffer one entry; return its location."""
        return self.append_many(ledger_id, ((entry_id, body),))[0]

    def append_many(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> list[int]:
        """Buffer the entries of one ledger, in order (an ADD_BATCH's), rolling to a new log
        where the next would not fit; return their locations."""
        locations: list[int] = []
        active = self._buffer.active
        assert active is not None
        tallies = self._tallies
        index = 0
        while True:
            data = active.data
            before = len(data)
            stop = record_codecs.pack_records(
                data,
                active.start,
                self._max_log_size,
                active.log_id << OFFSET_BITS,
                ledger_id,
                entries,
                index,
                locations,
            )
            tallies.active_records += stop - index  # each log counts its own records
            tallies.tally(ledger_id, len(data) - before)  # once per log per call
            if stop == len(entries):
                break
            active = self.roll()
            index = stop
        self._buffer.appended(len(active.data))
        return locations

    async def flush(self) -> None:
        """Write every buffered byte to its file (no fsync)."""
        await self._buffer.flush()

    async def sync(self) -> None:
        """Flush, then fsync every log written since the last sync (a checkpoint's first step)."""
        await self._buffer.sync()

    async def read(self, location: int, ledger_id: int, entry_id: int) -> bytes:
        """The body stored at ``location``, checked against its CRC and expected ids."""
        return await self._reads.read(location, ledger_id, entry_id)

    async def read_many(
        self, ledger_id: int, wanted: Sequence[tuple[int, int]], max_bytes: int
    ) -> list[bytes]:
        """A run of one ledger's entries: ``EntryReader.read_many``."""
        return await self._reads.read_many(ledger_id, wanted, max_bytes)

    async def complete_logs(self, older_than: int) -> list[int]:
        """Entry logs on disk that take no more appends and hold no buffered bytes, of those
        older than ``older_than`` (an ``active_log`` noted earlier: garbage collection takes
        only the logs whose every entry its checkpoint's index names)."""
        active_log = self._buffer.active_log
        busy = self._buffer.busy_logs()
        names = await self._disk.listdir(self._dir)
        ids = (int(name[:-4], 16) for name in names if is_log(name))
        limit = min(older_than, active_log)
        return sorted(i for i in ids if i < limit and i not in busy)

    async def remove_log(self, log_id: int) -> int:
        """Delete a complete entry log (garbage collection); return its size in bytes."""
        self._buffer.check_complete(log_id)
        path = os.path.join(self._dir, log_name(log_id))
        reader = self._reads.forget(log_id)
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
        self._tallies.forget(log_id)
        return size

    async def record_count(self, log_id: int) -> int:
        """How many records a complete entry log holds (``LogTallies.record_count``)."""
        return await self._tallies.record_count(log_id)

    async def known_record_count(self, log_id: int) -> int | None:
        """``record_count`` when it is known without walking the log (None otherwise)."""
        return await self._tallies.known_record_count(log_id)

    async def ledger_bytes(self, log_id: int, *, scan: bool = False) -> dict[int, int] | None:
        """Record bytes per ledger in a log (``LogTallies.ledger_bytes``)."""
        return await self._tallies.ledger_bytes(log_id, scan=scan)

    async def known_ledger_bytes(self, log_id: int) -> dict[int, int] | None:
        """``ledger_bytes`` as far as known without walking the log or writing anything."""
        return await self._tallies.known_ledger_bytes(log_id)

    async def log_size(self, log_id: int) -> int:
        """Bytes a log takes: its file, and for the active log its buffer too."""
        active = self._buffer.active
        if active is not None and log_id == active.log_id:
            return self.active_size
        buffered = self._buffer.buffered_size(log_id)
        return await (await self._reads.reader(log_id)).size() + buffered

    async def log_ids(self) -> list[int]:
        """Every entry log on disk, and the active one, ascending."""
        names = await self._disk.listdir(self._dir)
        ids = {int(name[:-4], 16) for name in names if is_log(name)}
        return sorted(ids | {self.active_log})

    def records(self, log_id: int) -> AsyncIterator[tuple[int, int, int, bytes]]:
        """(offset, ledger, entry, body) of every record of a complete log, in file order
        (``EntryReader.records``: compaction's walk)."""
        return self._reads.records(log_id)

    async def close(self) -> None:
        await self._buffer.close()
        await self._reads.close()
