"""What a benchmark reads of the resources a run uses, from /proc and the filesystem: a
process's resident memory, the bytes under a directory, this process's read system calls.

Linux only, as the benchmarks are (their floors are fdatasync and posix_fadvise).
"""

from __future__ import annotations

import os


def rss_mib(pid: int | str = "self") -> float:
    """Process ``pid``'s resident memory now, MiB (mapped file pages included, as for LMDB's
    map); this process's by default."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def disk_bytes(path: str) -> int:
    """The sizes of the files under ``path``, summed."""
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _dirs, names in os.walk(path)
        for name in names
    )


def read_calls() -> int:
    """Read system calls this process has made (``syscr`` of /proc/self/io)."""
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("syscr:"):
                return int(line.split()[1])
    return 0
