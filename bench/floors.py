"""Physical floors measured in the same run as the thing they bound.

- fdatasync: write the next 4 KiB of a file on the data disk and fdatasync it, sequentially.
- loopback round trip: 64 bytes ping-pong between two processes with blocking sockets (the
  least Python can spend on a round trip).
- copying: read a cold file and write it to another with an fdatasync every chunk, on the same
  disk (what re-replication's bytes cost at least; ``aiobk bench autorecovery``).
- quorum fdatasync: the same append + fdatasync issued to N files at once (one thread each,
  as N bookies sharing the disk do); the time until the k-th finishes. With one disk that
  serialises cache flushes, the 2nd of 3 costs nearly two fdatasyncs: the least an
  E3 WQ3 AQ2 add can wait on this machine, whatever the software does.

The fdatasync floors write into files zero-filled and synced beforehand, as the bookie's journal
(``PREALLOCATE``) and etcd's WAL (64 MB segments) are: an fdatasync of blocks already allocated
commits no metadata. Until 2026-11-27 they appended to a growing file, whose every fdatasync
also writes the inode for the new size: measured side by side on this machine, 1.4-1.9x one
overwrite's time, 1.25-1.5x for the 2nd of 3 -- a floor more generous than the disk work the
journal does.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from hdrh.histogram import HdrHistogram

ECHO_SERVER = r"""
import socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    data = conn.recv(65536)
    if not data:
        break
    conn.sendall(data)
"""


def new_histogram() -> HdrHistogram:
    """Microseconds from 1 us to 60 s, 3 significant digits."""
    return HdrHistogram(1, 60_000_000, 3)


BLOCK = 4096


def preallocated(path: str, size: int) -> int:
    """A new file of ``size`` zero bytes, synced (data and size): its blocks are allocated, so
    a write over them and an fdatasync commit no metadata. Returns the descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        zeros = bytes(min(size, 1 << 20))
        done = 0
        while done < size:
            done += os.pwrite(fd, zeros[: size - done], done)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.remove(path)
        raise
    return fd


def fdatasync_floor(directory: str, count: int, max_seconds: float = 10.0) -> HdrHistogram:
    histogram = new_histogram()
    path = os.path.join(directory, "fdatasync-floor.tmp")
    fd = preallocated(path, count * BLOCK)
    block = os.urandom(BLOCK)
    deadline = time.monotonic() + max_seconds
    try:
        for index in range(count):
            started = time.perf_counter_ns()
            os.pwrite(fd, block, index * BLOCK)
            os.fdatasync(fd)
            histogram.record_value(max(1, (time.perf_counter_ns() - started) // 1000))
            if time.monotonic() > deadline:
                break
    finally:
        os.close(fd)
        os.remove(path)
    return histogram


def quorum_fdatasync_floor(
    directory: str, writers: int, kth: int, count: int, max_seconds: float = 10.0
) -> HdrHistogram:
    """Rounds of ``writers`` concurrent writes of the next 4 KiB + fdatasync, one preallocated
    file and thread each; records when the ``kth`` of them finished, from the round's start."""
    histogram = new_histogram()
    paths = [os.path.join(directory, f"quorum-floor-{i}.tmp") for i in range(writers)]
    fds: list[int] = []
    try:
        fds.extend(preallocated(path, count * BLOCK) for path in paths)
    except BaseException:
        for fd, path in zip(fds, paths, strict=False):
            os.close(fd)
            os.remove(path)
        raise
    block = os.urandom(BLOCK)
    written = [0] * writers
    start = threading.Barrier(writers + 1, timeout=30)
    finish = threading.Barrier(writers + 1, timeout=30)
    finished = [0] * writers
    stop = False

    def writer(index: int) -> None:
        while True:
            start.wait()
            if stop:
                return
            os.pwrite(fds[index], block, written[index])
            written[index] += BLOCK
            os.fdatasync(fds[index])
            finished[index] = time.perf_counter_ns()
            finish.wait()

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(writers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + max_seconds
    try:
        for _ in range(count):
            started = time.perf_counter_ns()
            start.wait()
            finish.wait()
            done = sorted(finished)[kth - 1]
            histogram.record_value(max(1, (done - started) // 1000))
            if time.monotonic() > deadline:
                break
    finally:
        stop = True
        start.wait()
        for thread in threads:
            thread.join(30)
        for fd, path in zip(fds, paths, strict=True):
            os.close(fd)
            os.remove(path)
    return histogram


def loopback_rtt_floor(count: int, max_seconds: float = 10.0) -> HdrHistogram:
    histogram = new_histogram()
    server = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            message = b"x" * 64
            deadline = time.monotonic() + max_seconds
            for _ in range(count):
                started = time.perf_counter_ns()
                sock.sendall(message)
                received = 0
                while received < len(message):
                    received += len(sock.recv(65536))
                histogram.record_value(max(1, (time.perf_counter_ns() - started) // 1000))
                if time.monotonic() > deadline:
                    break
    finally:
        server.kill()
        server.wait(5)
        if server.stdout is not None:
            server.stdout.close()
    return histogram


# ---------------------------------------------------------------------- copying a disk's bytes

MB = 1_000_000  # rates in MB/s (10^6 bytes), as disks are rated
MIB = 1024 * 1024
CPU_TICKS = os.sysconf("SC_CLK_TCK")


def evict_files(paths: Sequence[str]) -> None:
    """Every file under ``paths`` written back and dropped from the page cache (no root
    needed; fsync first, as DONTNEED leaves dirty pages in place)."""
    for top in paths:
        for root, _dirs, names in os.walk(top):
            for name in names:
                with contextlib.suppress(OSError):  # a file the bookie just removed
                    fd = os.open(os.path.join(root, name), os.O_RDONLY)
                    try:
                        os.fsync(fd)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)


def make_copy_source(directory: str, size: int) -> str:
    """A synced file of ``size`` bytes (distinct 1 MiB blocks, nothing a disk could elide)."""
    path = os.path.join(directory, "floor-source.bin")
    blocks = [os.urandom(MIB) for _ in range(8)]
    with open(path, "wb") as out:
        written = 0
        while written < size:
            block = blocks[(written // MIB) % len(blocks)][: size - written]
            out.write(block)
            written += len(block)
        out.flush()
        os.fsync(out.fileno())
    return path


def copy_floor(source: str, directory: str, size: int, chunk: int) -> float:
    """MB/s of copying ``size`` bytes of the cold ``source`` to a new file on the same disk,
    ``chunk`` bytes at a time, each written then fdatasynced."""
    target = os.path.join(directory, "floor-copy.bin")
    src = os.open(source, os.O_RDONLY)
    dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fadvise(src, 0, 0, os.POSIX_FADV_DONTNEED)
        started = time.perf_counter()
        offset = 0
        while offset < size:  # bounded: every turn moves a chunk or stops
            data = os.pread(src, min(chunk, size - offset), offset)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view) :]
            os.fdatasync(dst)
            offset += len(data)
        elapsed = time.perf_counter() - started
    finally:
        os.close(src)
        os.close(dst)
        os.remove(target)
    return offset / MB / elapsed if elapsed > 0 else 0.0


def process_cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far; with
    ``children``, also those of its children it has waited for (a forked AOF rewrite)."""
    return sum(process_cpu_split(pid, children))


def process_cpu_split(pid: int, children: bool = False) -> tuple[float, float]:
    """``process_cpu_seconds`` as (user, system): what the process ran itself, and what the
    kernel ran for it (system calls: the socket and file I/O, page faults)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    user, system = int(fields[11]), int(fields[12])
    if children:
        user, system = user + int(fields[13]), system + int(fields[14])
    return user / CPU_TICKS, system / CPU_TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
