"""A small filesystem for a bookie process, so that a test can fill it.

As root the test mounts a real tmpfs of the asked size (and unmounts it afterwards). Without
root no filesystem can be mounted, so a simulated one stands in: the bookie process runs with
``QuotaDisk`` (installed by ``tests/hostile/quota/sitecustomize.py`` through PYTHONPATH), real
files under a byte quota that answers ENOSPC and reports usage like a filesystem of that size.
``SmallDisk.how`` says which one a test ran on; ``AIOBK_TEST_SIMULATED_DISK=1`` picks the
simulated one as root too (how that path is checked on a machine where tests run as root).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiobk.bookie.disk import AppendFile, OsDisk
from aiobk.bookie.index.twin import TwinIndex
from tests.support.append_file import DelegatingAppendFile

QUOTA_ENV = "AIOBK_TEST_DISK_QUOTA"  # "ROOT:BYTES[,ROOT:BYTES]" for the bookie process
SIMULATE_ENV = "AIOBK_TEST_SIMULATED_DISK"  # set: the simulated disk even as root
SITE_DIR = Path(__file__).parent / "quota"
REPO = Path(__file__).resolve().parents[2]


class SmallDisk:
    def __init__(self, path: Path, size: int, mounted: bool) -> None:
        self.path = path
        self.size = size
        self.mounted = mounted

    @property
    def how(self) -> str:
        if self.mounted:
            return f"a real {self.size >> 20} MiB tmpfs"
        return (
            f"a simulated {self.size >> 20} MiB disk (QuotaDisk): not root, so no filesystem "
            "can be mounted"
        )

    def env(self, *others: SmallDisk) -> dict[str, str]:
        """What the bookie process needs to see this disk (and ``others``) as full as they
        are."""
        simulated = [disk for disk in (self, *others) if not disk.mounted]
        if not simulated:
            return {}
        return {
            QUOTA_ENV: ",".join(f"{disk.path}:{disk.size}" for disk in simulated),
            "PYTHONPATH": os.pathsep.join([str(SITE_DIR), str(REPO)]),
        }

    def free(self) -> int:
        if self.mounted:
            stat = os.statvfs(self.path)
            return stat.f_bavail * stat.f_frsize
        return max(0, self.size - tree_bytes(self.path))

    def fill(self, leave: int = 0) -> Path:
        """Write a junk file until at most ``leave`` bytes are free; return it."""
        junk = self.path / "junk"
        with open(junk, "ab") as handle:
            block = bytes(1 << 20)
            for _ in range(self.size >> 20):  # bounded: no more than the disk holds
                room = self.free() - leave
                if room <= 0:
                    break
                try:
                    handle.write(block[: min(len(block), room)])
                    handle.flush()
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        return junk


def tree_bytes(root: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(directory, name)).st_size
    return total


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[SmallDisk]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = False
    if os.geteuid() == 0 and not os.environ.get(SIMULATE_ENV):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        mounted = True
    try:
        yield SmallDisk(path, size, mounted)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


class QuotaDisk(TwinIndex, OsDisk):
    """Real files under each root that may not pass its quota in bytes: simulated small disks
    (a path under none of them is on the host's disk as usual)."""

    def __init__(self, quotas: dict[str, int]) -> None:
        super().__init__()
        self.quotas = {Path(root).resolve(): quota for root, quota in quotas.items()}

    def _disk_of(self, path: str) -> tuple[Path, int] | None:
        resolved = Path(path).resolve()
        for root, quota in self.quotas.items():
            if resolved == root or root in resolved.parents:
                return root, quota
        return None

    def check(self, path: str, size: int) -> None:
        found = self._disk_of(path)
        if found is not None and tree_bytes(found[0]) + size > found[1]:
            raise OSError(errno.ENOSPC, "No space left on device (quota)")

    async def open_append(
        self, path: str, lane: str, sync_lane: str | None = None, preallocate: int = 0
    ) -> AppendFile:
        # No preallocation: its zero-fill would pass the quota unseen.
        return _QuotaFile(self, path, await super().open_append(path, lane, sync_lane, 0))

    async def write_file_atomic(self, path: str, data: bytes) -> None:
        self.check(path, len(data))
        await super().write_file_atomic(path, data)

    async def allocate(self, path: str, size: int) -> None:
        self.check(path, size)
        await super().allocate(path, size)

    async def usage(self, path: str) -> tuple[int, int]:
        found = self._disk_of(path)
        if found is None:
            return await super().usage(path)
        root, quota = found
        return max(0, quota - tree_bytes(root)), quota

    async def filesystem(self, path: str) -> int:
        found = self._disk_of(path)
        return hash(found[0]) if found is not None else await super().filesystem(path)


class _QuotaFile(DelegatingAppendFile):
    def __init__(self, disk: QuotaDisk, path: str, inner: AppendFile) -> None:
        super().__init__(inner)
        self._disk = disk
        self._path = path

    async def write(self, data: bytes) -> None:
        self._disk.check(self._path, len(data))
        await self._inner.write(data)

    async def write_and_sync(self, data: bytes) -> None:
        self._disk.check(self._path, len(data))
        await self._inner.write_and_sync(data)

    def write_and_sync_now(self, data: bytes) -> None:
        self._disk.check(self._path, len(data))
        self._inner.write_and_sync_now(data)

    def write_now(self, data: bytes) -> None:
        self._disk.check(self._path, len(data))
        self._inner.write_now(data)


def install(spec: str) -> None:
    """Make every bookie in this process use ``QuotaDisk`` (``spec``: "ROOT:BYTES[,...]")."""
    quotas = {}
    for entry in spec.split(","):
        root, _sep, quota = entry.rpartition(":")
        quotas[root] = int(quota)
    try:  # this tree, or one from before the single aiobk namespace (python -m tests.hostile --src)
        server = importlib.import_module("aiobk.bookie.server")
    except ModuleNotFoundError:
        server = importlib.import_module("bookie.server")

    def make(*_args: Any, **_kw: Any) -> QuotaDisk:
        return QuotaDisk(quotas)

    server.OsDisk = make
