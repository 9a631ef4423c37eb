"""What garbage collection counts of each entry log: its number of records (compaction's
denominator) and the bytes each ledger's records take in it (what its report calls live bytes).

Both are tallied while appending. Once a log is complete they are kept beside it --
``XXXXXXXX.cnt`` for the count, ``XXXXXXXX.lmap`` (pairs of big-endian u64: ledger, bytes) for
the bytes -- or, for a log from an earlier life whose files are missing, found by walking it
once."""

from __future__ import annotations

import os

from aiobk.bookie.disk import Disk
from aiobk.bookie.entrylog.buffer import LogBuffer
from aiobk.bookie.entrylog.format import LEDGER_BYTES, count_name, map_name
from aiobk.bookie.entrylog.reads import EntryReader


class LogTallies:
    def __init__(self, disk: Disk, directory: str, buffer: LogBuffer, reads: EntryReader) -> None:
        self._disk = disk
        self._dir = directory
        self._buffer = buffer
        self._reads = reads
        self.active_records = 0  # records appended to the active log in this life
        self._appended: dict[int, int] = {}  # records of the logs this life completed
        self._counts: dict[int, int] = {}  # records in complete logs, as far as known
        self._active_bytes: dict[int, int] = {}  # ledger -> record bytes in the active log
        self._completed_bytes: dict[int, dict[int, int]] = {}  # the same, logs not yet saved

    def tally(self, ledger_id: int, size: int) -> None:
        if size:
            tally = self._active_bytes
            tally[ledger_id] = tally.get(ledger_id, 0) + size

    def complete(self, log_id: int) -> None:
        """The active log ``log_id`` takes no more appends: its tallies are final."""
        self._appended[log_id] = self.active_records  # complete: its count is final
        self.active_records = 0
        self._completed_bytes[log_id], self._active_bytes = self._active_bytes, {}

    def forget(self, log_id: int) -> None:
        """The log is gone: drop what is held of it."""
        self._counts.pop(log_id, None)
        self._appended.pop(log_id, None)
        self._completed_bytes.pop(log_id, None)

    async def record_count(self, log_id: int) -> int:
        """How many records a complete entry log holds (compaction's denominator): counted
        while appending in this life, else from its ``.cnt`` file, else by scanning it once
        (then kept in a ``.cnt`` file; a log never changes once complete)."""
        self._buffer.check_complete(log_id)
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
                count, sizes = await self._reads.scan(log_id)
                await self._save_map(log_id, sizes)
            await self._disk.write_file_atomic(path, str(count).encode())
        self._counts[log_id] = count
        return count

    async def known_record_count(self, log_id: int) -> int | None:
        """``record_count`` when it is known without walking the log (None otherwise); the
        active log's records appended so far."""
        active = self._buffer.active
        if active is not None and log_id == active.log_id:
            return self.active_records
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
        active = self._buffer.active
        if active is not None and log_id == active.log_id:
            return dict(self._active_bytes)
        tallied = self._completed_bytes.get(log_id)
        if self._buffer.writing(log_id):  # still being written out: not saved yet
            return None if tallied is None else dict(tallied)
        self._buffer.check_complete(log_id)
        if tallied is not None:
            await self._save_map(log_id, tallied)
            return dict(tallied)
        saved = await self._read_map(log_id)
        if saved is not None or not scan:
            return saved
        count, sizes = await self._reads.scan(log_id)
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
        active = self._buffer.active
        if active is not None and log_id == active.log_id:
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
