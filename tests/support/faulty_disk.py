"""Real files (``OsDisk``) with faults switched on at will: no space left, writes cut short
half-way, failing fdatasyncs, fdatasyncs that wait until let go (``sync_gate``). For component
tests of what the bookie does when a disk fails or stalls."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

from aiobk.bookie.disk import AppendFile, OsDisk
from aiobk.bookie.index.twin import TwinIndex
from tests.support.append_file import DelegatingAppendFile


class FaultyDisk(TwinIndex, OsDisk):
    def __init__(self) -> None:
        super().__init__()
        self.full = False  # writes raise ENOSPC
        self.partial = False  # ... after writing half of their bytes
        self.sync_error = 0  # errno an fdatasync raises (0: none)
        self.free = 1 << 40  # what usage() reports while not full
        self.writes_refused = 0
        # Set: every append file's fdatasyncs off the event loop (the journal's, the entry
        # logs') wait until it is set, as on a disk that stalls. A batch written and synced on
        # the loop itself (an idle bookie's lone add) is not held.
        self.sync_gate: asyncio.Event | None = None

    def refuse(self) -> OSError:
        self.writes_refused += 1
        return OSError(errno.ENOSPC, "No space left on device")

    async def open_append(
        self, path: str, lane: str, sync_lane: str | None = None, preallocate: int = 0
    ) -> AppendFile:
        if self.full:
            raise self.refuse()
        inner = await super().open_append(path, lane, sync_lane, preallocate)
        return _FaultyFile(self, inner)

    async def write_file_atomic(self, path: str, data: bytes) -> None:
        if self.full:
            raise self.refuse()
        await super().write_file_atomic(path, data)

    async def allocate(self, path: str, size: int) -> None:
        if self.full:
            raise self.refuse()
        await super().allocate(path, size)

    async def usage(self, path: str) -> tuple[int, int]:
        return (0 if self.full else self.free), 1 << 40


class _FaultyFile(DelegatingAppendFile):
    def __init__(self, disk: FaultyDisk, inner: AppendFile) -> None:
        super().__init__(inner)
        self._disk = disk

    def _check(self, data: bytes, write: Any) -> None:
        if not self._disk.full:
            return
        if self._disk.partial and len(data) > 1:
            write(data[: len(data) // 2])  # half of it reaches the file
            self._disk.partial = False
            raise self._disk.refuse()
        raise self._disk.refuse()

    def _sync_check(self) -> None:
        if self._disk.sync_error:
            raise OSError(self._disk.sync_error, "fdatasync failed")

    async def _stalled(self) -> None:
        gate = self._disk.sync_gate
        if gate is not None:
            await gate.wait()

    async def write(self, data: bytes) -> None:
        self._check(data, self._inner.write_now)
        await self._inner.write(data)

    async def write_and_sync(self, data: bytes) -> None:
        self._check(data, self._inner.write_now)
        await self._stalled()
        self._sync_check()
        await self._inner.write_and_sync(data)

    def write_and_sync_now(self, data: bytes) -> None:
        self._check(data, self._inner.write_now)
        self._sync_check()
        self._inner.write_and_sync_now(data)

    def write_now(self, data: bytes) -> None:
        self._check(data, self._inner.write_now)
        self._inner.write_now(data)

    async def sync(self) -> None:
        await self._stalled()
        self._sync_check()
        await self._inner.sync()
