"""The disk seam: every byte the bookie stores goes through these interfaces.

Production uses ``OsDisk`` (real files, fdatasync, blocking calls on threads). A simulator hands
in its own ``Disk`` that keeps data in memory and drops whatever was not synced on a crash.

Threads: each *lane* is one long-lived thread fed by a queue (``bookie.lane``), so writes to a
file happen in order and a write + fdatasync is one hop off the event loop. The journal has its
own lane (its latency is the add latency), ledger storage another; reads go to a small shared
pool because ``pread`` is positional and needs no ordering -- unless the page cache holds them
(read on the event loop with RWF_NOWAIT) or they are small and the disk answers faster than a
hop to a thread would (``bookie.read_route``: measured as the bookie runs). One dedicated
thread per lane measured faster than aiofiles (which hops to the default executor per call and
cannot fuse write+sync into one hop).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from aiobk.bookie.lane import Lane
from aiobk.bookie.read_route import ReadRoute

if TYPE_CHECKING:
    from aiobk.bookie.index.engine import IndexDb

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# Reads up to this size are first tried from the page cache on the event loop (RWF_NOWAIT).
INLINE_READ_MAX = 256 * 1024
# Reads up to this size that need the disk go where ``ReadRoute`` says (an entry, an index page);
# larger ones (scans of a log or the journal) always on a thread.
ROUTED_READ_MAX = 16 * 1024


class AppendFile(Protocol):
    """A file opened for appending at its end; ``size`` counts bytes handed to ``write``."""

    @property
    def size(self) -> int: ...

    async def write(self, data: bytes) -> None: ...

    async def write_and_sync(self, data: bytes) -> None: ...

    def write_and_sync_now(self, data: bytes) -> None:
        """Write and sync on the calling thread (blocks it): for a lone small write, where a
        hop to a thread and back costs more than the loop loses by waiting."""
        ...

    def write_now(self, data: bytes) -> None:
        """Write (no sync) on the calling thread: a small write into the page cache."""
        ...

    @property
    def room(self) -> int:
        """Bytes a write may take now without first allocating more of the file (which a
        preallocated file does by writing zeros and an fsync: nothing for the event loop)."""
        ...

    async def sync(self) -> None: ...

    async def rewind(self, size: int) -> None:
        """Make the file end at ``size`` again (a write after it failed, or was never synced,
        is to be written once more): the next write goes to ``size``."""
        ...

    async def close(self) -> None: ...


class ReadFile(Protocol):
    async def pread(self, offset: int, size: int) -> bytes: ...

    async def size(self) -> int: ...

    async def close(self) -> None: ...


class Disk(Protocol):
    async def open_append(
        self, path: str, lane: str, sync_lane: str | None = None, preallocate: int = 0
    ) -> AppendFile:
        """``sync_lane`` (if given) runs ``sync()`` on its own thread, so an fdatasync does not
        hold up the next write to the same file. ``preallocate`` > 0 zero-fills (and syncs) the
        file ahead of the writes in chunks of that size: writes then overwrite allocated blocks
        and an fdatasync has no metadata to commit (the file must be new)."""
        ...

    async def open_read(self, path: str) -> ReadFile: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` so that a crash leaves the old or the new file."""
        ...

    async def listdir(self, path: str) -> list[str]: ...

    async def makedirs(self, path: str) -> None: ...

    async def remove(self, path: str) -> None: ...

    async def exists(self, path: str) -> bool: ...

    async def sync_dir(self, path: str) -> None: ...

    async def truncate(self, path: str, size: int) -> None: ...

    async def usage(self, path: str) -> tuple[int, int]:
        """(free bytes, total bytes) of the filesystem holding ``path``."""
        ...

    async def filesystem(self, path: str) -> int:
        """An id of the filesystem holding ``path`` (equal ids: one filesystem)."""
        ...

    async def allocate(self, path: str, size: int) -> None:
        """Create ``path`` holding ``size`` bytes of allocated space (a reserve to give back
        when the disk is full); raises ENOSPC, leaving no file, if there is not room."""
        ...

    async def open_index(self, path: str, *, cache_bytes: int, write_buffer: int) -> IndexDb:
        """The index engine that runs on this disk (``bookie.index``): RocksDB on real files; a
        disk that must see every write (the simulator's, fault injectors) returns the twin over
        itself (``bookie.index.twin.TwinIndex``)."""
        ...

    async def close(self) -> None: ...


class _OsAppendFile:
    __slots__ = (
        "_allocated",
        "_chunk",
        "_closed",
        "_fd",
        "_lane",
        "_size",
        "_sync_lane",
        "path",
    )

    def __init__(
        self,
        path: str,
        fd: int,
        size: int,
        lane: Lane,
        sync_lane: Lane | None = None,
        preallocate: int = 0,
    ) -> None:
        self.path = path
        self._fd = fd
        self._size = size
        self._lane = lane
        self._sync_lane = sync_lane or lane
        self._closed = False
        self._chunk = preallocate
        self._allocated = size  # bytes zero-filled and synced (preallocated files)

    @property
    def size(self) -> int:
        return self._size

    @property
    def room(self) -> int:
        if not self._chunk:
            return sys.maxsize  # appending grows the file: no zero-fill, no fsync
        return self._allocated - self._size

    def _write_all(self, data: bytes) -> None:
        if not self._chunk:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            return
        end = self._size  # already counted: the data goes just before it
        start = end - len(data)
        if end > self._allocated:
            try:
                self._zero_fill(max(self._chunk, end - self._allocated))
            except OSError as exc:
                if exc.errno not in _NO_SPACE or self._chunk <= end - self._allocated:
                    raise
                # No room for the chunk ahead: allocate what this write needs, if there is that.
                self._zero_fill(end - self._allocated)
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, start)
            view = view[written:]
            start += written

    def _zero_fill(self, grow: int) -> None:
        zeros = bytes(min(grow, 1 << 20))
        position = self._allocated
        while position < self._allocated + grow:
            position += os.pwrite(self._fd, zeros[: self._allocated + grow - position], position)
        os.fsync(self._fd)  # size and extents durable once, not at every fdatasync
        self._allocated += grow

    def _write_sync(self, data: bytes) -> None:
        self._write_all(data)
        os.fdatasync(self._fd)

    # ``size`` counts a write from when it is handed over (later writes on the lane go after
    # it); a write that fails gives its bytes back, so that the next one lands where it would.

    async def write(self, data: bytes) -> None:
        self._size += len(data)
        try:
            await self._lane.run(self._write_all, data)
        except OSError:
            self._size -= len(data)
            raise

    async def write_and_sync(self, data: bytes) -> None:
        self._size += len(data)
        try:
            await self._lane.run(self._write_sync, data)
        except OSError:
            self._size -= len(data)
            raise

    def write_and_sync_now(self, data: bytes) -> None:
        self._size += len(data)
        try:
            self._write_sync(data)
        except OSError:
            self._size -= len(data)
            raise

    def write_now(self, data: bytes) -> None:
        self._size += len(data)
        try:
            self._write_all(data)
        except OSError:
            self._size -= len(data)
            raise

    async def sync(self) -> None:
        await self._sync_lane.run(os.fdatasync, self._fd)

    async def rewind(self, size: int) -> None:
        if not self._chunk:  # appending at the file's end: cut what follows
            await self._lane.run(os.ftruncate, self._fd, size)
        self._size = size

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._lane.run(os.close, self._fd)


class _NoInlineReads(Exception):
    """The kernel or the file system cannot say whether a read would wait."""


def _cached_pread(fd: int, offset: int, size: int) -> bytes | None:
    """The bytes if the page cache holds them all (or all up to the end of the file), read
    without leaving the event loop; None if the disk would be needed. A hop to the executor
    and back costs more than reading a cold block on a fast disk (86 us against 70 us here),
    and most reads -- a tail, a recent entry -- are cached."""
    buffer = bytearray(size)
    done = 0
    while done < size:
        try:
            got = os.preadv(fd, [memoryview(buffer)[done:]], offset + done, os.RWF_NOWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                raise _NoInlineReads from exc
            raise
        if got == 0:  # the end of the file
            del buffer[done:]
            break
        done += got
    return bytes(buffer)


def _timed_pread(fd: int, size: int, offset: int) -> tuple[bytes, int]:
    started = time.perf_counter_ns()
    data = os.pread(fd, size, offset)
    return data, time.perf_counter_ns() - started


class _OsReadFile:
    __slots__ = ("_executor", "_fd", "_inline", "_loop", "_route")

    def __init__(self, fd: int, executor: ThreadPoolExecutor, route: ReadRoute) -> None:
        self._fd = fd
        self._executor = executor
        self._loop = asyncio.get_running_loop()
        self._inline = hasattr(os, "RWF_NOWAIT")
        self._route = route

    async def pread(self, offset: int, size: int) -> bytes:
        route = self._route
        small = size <= ROUTED_READ_MAX
        if small and route.inline():
            # The disk is quicker than a hop to a thread (bookie.read_route): read here, from
            # the page cache or not -- a probe of the page cache first would cost a system
            # call, and a raised error for a page not cached, before the same read.
            started = time.perf_counter_ns()
            data = os.pread(self._fd, size, offset)
            route.read_inline(time.perf_counter_ns() - started)
            return data
        if self._inline and size <= INLINE_READ_MAX:
            try:
                cached = _cached_pread(self._fd, offset, size)
            except _NoInlineReads:
                self._inline = False
            else:
                if cached is not None:
                    return cached
        executor = self._executor
        if not small:
            return await self._loop.run_in_executor(executor, os.pread, self._fd, size, offset)
        started = time.perf_counter_ns()
        data, disk_ns = await self._loop.run_in_executor(
            executor, _timed_pread, self._fd, size, offset
        )
        route.read_on_thread(time.perf_counter_ns() - started, disk_ns)
        return data

    async def size(self) -> int:
        stat = await self._loop.run_in_executor(self._executor, os.fstat, self._fd)
        return stat.st_size

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _read_whole(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _open_append(path: str) -> tuple[int, int]:
    existed = os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if not existed:
        _fsync_dir(os.path.dirname(path) or ".")
    return fd, os.fstat(fd).st_size


def _open_positional(path: str) -> tuple[int, int]:
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists: a preallocated file must be new")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    _fsync_dir(os.path.dirname(path) or ".")
    return fd, 0


def _truncate(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _usage(path: str) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return usage.free, usage.total


def _allocate(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        os.remove(path)
        raise
    os.close(fd)
    _fsync_dir(os.path.dirname(path) or ".")


class OsDisk:
    """Real files. Blocking calls run on lane threads (ordered) or the read pool."""

    def __init__(self, read_threads: int = 4) -> None:
        self._lanes: dict[str, Lane] = {}
        self._pool = ThreadPoolExecutor(read_threads, thread_name_prefix="aiobk-io")
        self.read_route = ReadRoute()  # one disk's figures, shared by its files

    def _lane(self, name: str) -> Lane:
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = Lane(name)
        return lane

    async def open_append(
        self, path: str, lane: str, sync_lane: str | None = None, preallocate: int = 0
    ) -> AppendFile:
        writes = self._lane(lane)
        opener = _open_positional if preallocate else _open_append
        fd, size = await writes.run(opener, path)
        syncs = self._lane(sync_lane) if sync_lane is not None else None
        return _OsAppendFile(path, fd, size, writes, syncs, preallocate)

    async def open_read(self, path: str) -> ReadFile:
        loop = asyncio.get_running_loop()
        fd = await loop.run_in_executor(self._pool, os.open, path, os.O_RDONLY)
        return _OsReadFile(fd, self._pool, self.read_route)

    async def read_file(self, path: str) -> bytes:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _read_whole, path)

    async def write_file_atomic(self, path: str, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, _write_atomic, path, data)

    async def listdir(self, path: str) -> list[str]:
        loop = asyncio.get_running_loop()
        return sorted(await loop.run_in_executor(self._pool, os.listdir, path))

    async def makedirs(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, lambda: os.makedirs(path, exist_ok=True))

    async def remove(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, os.remove, path)

    async def exists(self, path: str) -> bool:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, os.path.exists, path)

    async def sync_dir(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, _fsync_dir, path)

    async def truncate(self, path: str, size: int) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, _truncate, path, size)

    async def usage(self, path: str) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _usage, path)

    async def filesystem(self, path: str) -> int:
        loop = asyncio.get_running_loop()
        return (await loop.run_in_executor(self._pool, os.stat, path)).st_dev

    async def allocate(self, path: str, size: int) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, _allocate, path, size)

    async def open_index(self, path: str, *, cache_bytes: int, write_buffer: int) -> IndexDb:
        # RocksDB (rocksdict) is the bookie extra's: imported when a bookie opens its index, so
        # the rest of the layer (its config, cookies, `aiobk bookie format`) loads without it.
        from aiobk.bookie.index.rocks import RocksIndexDb  # noqa: PLC0415

        return await RocksIndexDb.open(path, cache_bytes=cache_bytes, write_buffer=write_buffer)

    async def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()
        self._pool.shutdown(wait=True)
