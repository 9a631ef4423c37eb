"""The real disk's reads: from the page cache on the event loop when it holds them, through the
executor when the disk is needed (bookie.disk)."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

from aiobk.bookie import OsDisk
from aiobk.bookie.disk import _cached_pread
from tests.support.wait import wait_until_sync

DATA = bytes(range(256)) * 64  # 16 KiB


def _written(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    with open(path, "wb") as out:
        out.write(DATA)
        out.flush()
        os.fsync(out.fileno())
    return path


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def _cached_pages(fd: int, size: int) -> int:
    """How many of the file's pages the page cache holds (mincore(2): asking does not read
    anything in, where a probing read would start the kernel's readahead)."""
    address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    try:
        pages = -(-size // mmap.PAGESIZE)
        vector = ctypes.create_string_buffer(pages)
        if _libc.mincore(address, size, vector) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(byte & 1 for byte in vector.raw)
    finally:
        _libc.munmap(address, size)


def _evict(path: Path) -> None:
    """Drop the file's pages from the page cache, and wait until they are gone: pages the
    kernel's readahead is still reading in (started by the reads just before) are locked and
    survive a DONTNEED, so one call left a "cold" page cached now and then."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size

        def evicted() -> bool:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return _cached_pages(fd, size) == 0

        wait_until_sync(evicted, timeout=5.0, every=0.005, what=f"{path} out of the page cache")
    finally:
        os.close(fd)


def test_a_cached_read_is_served_inline_and_a_cold_one_never_wrongly(tmp_path: Path) -> None:
    path = _written(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _cached_pread(fd, 100, 4096) == DATA[100:4196]
        assert _cached_pread(fd, len(DATA) - 10, 4096) == DATA[-10:]  # up to the end
        assert _cached_pread(fd, len(DATA) + 5, 4096) == b""
        # An evicted page: the disk is needed, and a NOWAIT read is refused -- or, on kernels
        # that start the read themselves and answer when the disk was quick (6.x here: from
        # 1 in 20 to most reads, run to run), answered with the right bytes. Never wrong ones.
        for _ in range(20):
            _evict(path)
            assert _cached_pread(fd, 8192, 4096) in (None, DATA[8192:12288])
    finally:
        os.close(fd)


async def test_pread_reads_the_same_bytes_either_way(tmp_path: Path) -> None:
    path = _written(tmp_path)
    disk = OsDisk()
    reader = await disk.open_read(str(path))
    try:
        warm = await reader.pread(1000, 3000)
        _evict(path)
        cold = await reader.pread(1000, 3000)
        tail = await reader.pread(len(DATA) - 7, 4096)
        big = await reader.pread(0, 1 << 20)  # over the inline bound: the executor's
    finally:
        await reader.close()
        await disk.close()
    assert warm == cold == DATA[1000:4000]
    assert tail == DATA[-7:]
    assert big == DATA


async def test_cold_reads_follow_the_route_and_teach_it(tmp_path: Path) -> None:
    """Small cold reads on a thread while nothing is known, then where the measured figures
    say; the bytes are the same either way and every read feeds the figures."""
    path = _written(tmp_path)
    disk = OsDisk()
    route = disk.read_route
    reader = await disk.open_read(str(path))
    # The route is what is tested: no NOWAIT probe of the page cache first, which this kernel
    # may answer for an evicted page (the test above), skipping the route.
    reader._inline = False  # type: ignore[attr-defined]
    route.cached_below_ns = 0  # every inline read counts, however quick (an eviction not taken)
    try:
        _evict(path)
        first = await reader.pread(0, 4096)  # nothing measured: a thread, which measures both
        assert route.disk_ns is not None
        assert route.hop_ns is not None
        route.disk_ns, route.hop_ns = 1.0, 1e9  # as if the disk were far quicker than a hop
        _evict(path)
        inline = await reader.pread(4096, 4096)
        assert route.disk_ns > 1.0  # measured...
        assert route.hop_ns == 1e9  # ...on the loop: no hop taken
        route.disk_ns, route.hop_ns = 1e9, 1.0  # as if the disk were far slower
        _evict(path)
        threaded = await reader.pread(8192, 4096)
        assert route.hop_ns != 1.0  # measured on a thread
    finally:
        await reader.close()
        await disk.close()
    assert first + inline + threaded == DATA[:12288]
