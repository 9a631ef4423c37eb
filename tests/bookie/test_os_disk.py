"""The real disk's reads: from the page cache on the event loop when it holds them, through the
executor when the disk is needed (bookie.disk)."""

from __future__ import annotations

import os
from pathlib import Path

from aiobk.bookie import OsDisk
from aiobk.bookie.disk import _cached_pread

DATA = bytes(range(256)) * 64  # 16 KiB


def _written(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    with open(path, "wb") as out:
        out.write(DATA)
        out.flush()
        os.fsync(out.fileno())
    return path


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_a_cached_read_is_served_inline_and_a_cold_one_is_not(tmp_path: Path) -> None:
    path = _written(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _cached_pread(fd, 100, 4096) == DATA[100:4196]
        assert _cached_pread(fd, len(DATA) - 10, 4096) == DATA[-10:]  # up to the end
        assert _cached_pread(fd, len(DATA) + 5, 4096) == b""
        _evict(path)
        assert _cached_pread(fd, 8192, 4096) is None  # the disk would be needed: not here
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
