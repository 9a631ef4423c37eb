"""A simulated disk for one bookie: files in memory, a page cache that a crash throws away.

Each file keeps its bytes as the bookie last wrote them (what reads see) and how many of them
are durable. ``crash()`` cuts every file back to its durable prefix -- optionally keeping a
seeded prefix of the unsynced tail, as a real disk may have written some of it -- and retires
every open handle: the dead process's late writes land nowhere. ``wipe()`` is a lost disk.
Faults: read errors (EIO on ``pread``) and a full disk (ENOSPC on writes). Latency: a sync of
ledger storage (entry logs, the index twin) is slow now and then (``slow_storage_syncs``: its
chance; 0.3-2 s), as on a disk whose writeback queue is long: checkpoints and garbage collection
then overlap crashes, full disks and the boot repair (the first campaign with it found the
repair ending for good on a failed journal sync).

File creation and removal are durable at once (``OsDisk`` fsyncs the directory for both), and
``write_file_atomic`` is durable when it returns, as on a real disk.
"""

from __future__ import annotations

import asyncio
import errno
import posixpath
import random
import sys
from dataclasses import dataclass, field

from aiobk.bookie.disk import AppendFile, ReadFile
from aiobk.bookie.index.twin import TwinIndex


@dataclass
class _File:
    data: bytearray = field(default_factory=bytearray)
    durable: int = 0  # bytes of data that survive a crash


class SimDisk(TwinIndex):
    def __init__(
        self,
        rng: random.Random,
        name: str,
        *,
        torn_tail: bool = True,
        slow_storage_syncs: float = 0.0,
    ) -> None:
        self._rng = rng
        self.name = name
        self.slow_storage_syncs = slow_storage_syncs
        self.files: dict[str, _File] = {}
        self.dirs: set[str] = set()
        self.generation = 0  # bumped by crash/wipe: older handles are dead
        self.full = False
        self.read_errors = 0.0  # probability of EIO per pread
        self.torn_tail = torn_tail
        self.syncs = 0
        self.allocated: dict[str, int] = {}  # reserve files and their sizes

    # ------------------------------------------------------------------ faults

    def crash(self) -> None:
        self.generation += 1
        for file in self.files.values():
            keep = file.durable
            if self.torn_tail and len(file.data) > keep and self._rng.random() < 0.5:
                keep += self._rng.randrange(len(file.data) - keep + 1)
            del file.data[keep:]
            file.durable = len(file.data)

    def wipe(self) -> None:
        self.generation += 1
        self.files.clear()
        self.allocated.clear()
        self.dirs.clear()

    # ------------------------------------------------------------------ helpers

    async def delay(self, low: float, high: float) -> None:
        await asyncio.sleep(self._rng.uniform(low, high))

    def _check_space(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, f"{self.name}: no space left on device")

    def _file(self, path: str) -> _File:
        file = self.files.get(path)
        if file is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return file

    # ------------------------------------------------------------------ Disk

    async def open_append(
        self, path: str, lane: str, sync_lane: str | None = None, preallocate: int = 0
    ) -> AppendFile:
        await self.delay(1e-5, 1e-4)
        if preallocate and path in self.files:
            raise FileExistsError(errno.EEXIST, "a preallocated file must be new", path)
        self._parent_exists(path)
        file = self.files.setdefault(path, _File())
        return _SimAppendFile(self, file, self.generation, lane != "journal")

    async def open_read(self, path: str) -> ReadFile:
        await self.delay(1e-5, 5e-5)
        return _SimReadFile(self, self._file(path), self.generation)

    async def read_file(self, path: str) -> bytes:
        await self.delay(1e-5, 1e-4)
        return bytes(self._file(path).data)

    async def write_file_atomic(self, path: str, data: bytes) -> None:
        generation = self.generation
        self._check_space()
        await self.delay(1e-4, 2e-3)
        if generation != self.generation:
            return  # the process died before the rename
        self._parent_exists(path)
        self.files[path] = _File(bytearray(data), len(data))

    async def listdir(self, path: str) -> list[str]:
        await self.delay(1e-5, 5e-5)
        path = path.rstrip("/")
        if path not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        names = {p[len(path) + 1 :].split("/")[0] for p in self.files if p.startswith(path + "/")}
        names |= {d[len(path) + 1 :].split("/")[0] for d in self.dirs if d.startswith(path + "/")}
        return sorted(names)

    async def makedirs(self, path: str) -> None:
        path = path.rstrip("/")
        while path and path != "/":
            self.dirs.add(path)
            path = posixpath.dirname(path)

    async def remove(self, path: str) -> None:
        await self.delay(1e-5, 5e-5)
        self._file(path)
        del self.files[path]
        self.allocated.pop(path, None)

    async def exists(self, path: str) -> bool:
        path = path.rstrip("/")
        return path in self.files or path in self.dirs

    async def sync_dir(self, path: str) -> None:
        await self.delay(1e-4, 1e-3)

    async def truncate(self, path: str, size: int) -> None:
        await self.delay(1e-4, 1e-3)
        file = self._file(path)
        del file.data[size:]
        file.durable = min(file.durable, len(file.data))

    async def usage(self, path: str) -> tuple[int, int]:
        total = 1 << 40
        used = sum(len(f.data) for f in self.files.values()) + sum(self.allocated.values())
        return (0 if self.full else total - used), total

    async def filesystem(self, path: str) -> int:
        return 0  # one disk per bookie, journal included

    async def allocate(self, path: str, size: int) -> None:
        """A reserve file: counted in ``usage``, never materialised in memory."""
        self._check_space()
        await self.delay(1e-4, 1e-3)
        self._parent_exists(path)
        self.files[path] = _File()
        self.allocated[path] = size

    async def close(self) -> None:
        return None

    def _parent_exists(self, path: str) -> None:
        parent = posixpath.dirname(path)
        if parent not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", parent)


class _SimAppendFile:
    def __init__(self, disk: SimDisk, file: _File, generation: int, storage: bool) -> None:
        self._disk = disk
        self._file = file
        self._generation = generation
        self._size = len(file.data)
        self._storage = storage  # ledger storage's (not the journal's): its syncs may be slow

    @property
    def size(self) -> int:
        return self._size

    @property
    def room(self) -> int:
        # Nothing is preallocated here; one ask in four says no room all the same, so that
        # the journal's lane writes (a batch handed to its thread) are run as well as the
        # writes on the loop, as OsDisk's preallocation makes them every few MiB.
        return 0 if self._disk._rng.random() < 0.25 else sys.maxsize

    def _alive(self) -> bool:
        return self._generation == self._disk.generation

    def write_now(self, data: bytes) -> None:
        self._disk._check_space()
        self._size += len(data)
        if self._alive():
            self._file.data += data

    def write_and_sync_now(self, data: bytes) -> None:
        self.write_now(data)
        self._sync_now()

    def _sync_now(self) -> None:
        if self._alive():
            self._file.durable = len(self._file.data)
            self._disk.syncs += 1

    async def write(self, data: bytes) -> None:
        # The bytes enter the "page cache" in call order (OsDisk's single-thread lane keeps
        # that order too); only the completion takes time.
        self.write_now(data)
        await self._disk.delay(1e-5, 2e-4)

    async def write_and_sync(self, data: bytes) -> None:
        await self.write(data)
        await self.sync()

    async def sync(self) -> None:
        # What the sync covers is what was written when it started.
        upto = len(self._file.data)
        disk = self._disk
        if (
            self._storage
            and disk.slow_storage_syncs
            and disk._rng.random() < disk.slow_storage_syncs
        ):
            await disk.delay(0.3, 2.0)
        else:
            await disk.delay(1e-4, 2e-3)
        if self._alive():
            self._file.durable = max(self._file.durable, min(upto, len(self._file.data)))
            self._disk.syncs += 1

    async def rewind(self, size: int) -> None:
        if self._alive():
            del self._file.data[size:]
            self._file.durable = min(self._file.durable, size)
        self._size = size

    async def close(self) -> None:
        return None


class _SimReadFile:
    def __init__(self, disk: SimDisk, file: _File, generation: int) -> None:
        self._disk = disk
        self._file = file
        self._generation = generation

    async def pread(self, offset: int, size: int) -> bytes:
        await self._disk.delay(1e-5, 2e-4)
        if self._disk.read_errors and self._disk._rng.random() < self._disk.read_errors:
            raise OSError(errno.EIO, f"{self._disk.name}: input/output error")
        return bytes(self._file.data[offset : offset + size])

    async def size(self) -> int:
        return len(self._file.data)

    async def close(self) -> None:
        return None
