"""Full disks (BookKeeper's LedgerDirsMonitor): read-only before a disk fills, writable again
once space is freed, and room kept for what must still work on a full disk.

Every ``disk_check_interval`` the filesystems the bookie writes (its data directory, and its
journal directory when that is another filesystem) are measured:

- above ``disk_usage_threshold`` (0.95) on any of them the bookie turns read-only
  (``bookie.write_state``): adds get EREADONLY and a writer changes its ensemble; reads,
  fencing, LAC reads and long polls are served; it is registered read-only, so new ledgers
  are placed elsewhere;
- above ``disk_usage_warn_threshold`` (0.90) a garbage collection pass is forced;
- once every one is back at or below ``disk_usage_lwm_threshold`` it is writable again (and a
  journal that had failed must first write again what it stalled, ``Journal.recover``);
- recovery adds stay welcome while every one has ``min_usable_size_for_high_priority_writes``
  free and the journal works.

Between two checks a fast writer can fill a disk; an ENOSPC from the journal, an entry log or a
checkpoint (``report``) turns the bookie read-only at once and checks again.

Room for what must work on a full disk: ``disk_reserved_space`` bytes (``reserve_size``: at
most 5% of the filesystem, at least what a checkpoint needs) are set aside in a
``DISK_RESERVE`` file on each filesystem and released when the bookie turns read-only for lack
of space, so that checkpoints (which garbage collection needs before it can remove a file),
fences and a clean stop can still write even if something else filled the disk; it is set
aside again once writable. Usage is reckoned as if the reserve were in place, so releasing it
cannot flip the decision. A bookie starting on a full disk releases the reserve before it
writes anything and starts read-only; with not a byte left (something else took the reserve
too) it still starts, its journal failed until there is room again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.disk import Disk
from aiobk.bookie.journal.files import PREALLOCATE as JOURNAL_CHUNK
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.write_state import DISK, JOURNAL, WriteState
from aiobk.tasks import TaskKeeper, cancel_and_wait

log = logging.getLogger(__name__)

RESERVE_FILE = "DISK_RESERVE"
RESERVE_SHARE = 0.05  # the reserve never takes more than this share of a filesystem
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True, slots=True)
class Usage:
    """One filesystem, as if its reserve were in place."""

    path: str
    free: int
    total: int

    @property
    def used(self) -> float:
        return 1.0 - self.free / self.total if self.total > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Verdict:
    full: bool
    why: str  # what is over the threshold, when full
    warn: bool  # force garbage collection
    room_for_high_priority: bool


def judge(usages: list[Usage], config: BookieConfig, was_full: bool) -> Verdict:
    """The decision of one check (pure). A full bookie stays full until every filesystem is
    at or below the low-water mark; a writable one turns full above the threshold."""
    limit = config.disk_usage_lwm_threshold if was_full else config.disk_usage_threshold
    over = [u for u in usages if u.used > limit]
    worst = max(usages, key=lambda u: u.used, default=None)
    why = ""
    if over and worst is not None:
        why = (
            f"{worst.path} is {worst.used:.1%} used (read-only above "
            f"{config.disk_usage_threshold:.0%}, writable again at "
            f"{config.disk_usage_lwm_threshold:.0%})"
        )
    return Verdict(
        full=bool(over),
        why=why,
        warn=any(u.used > config.disk_usage_warn_threshold for u in usages),
        room_for_high_priority=all(
            u.free >= config.min_usable_size_for_high_priority_writes for u in usages
        ),
    )


def reserve_size(config: BookieConfig, total: int) -> int:
    """``disk_reserved_space``, at most 5% of the filesystem -- but never less than what a
    checkpoint must write on a full disk (the entry-log buffer the full disk stopped, a
    journal chunk, a margin for the index), and never more than a quarter of the disk.
    0 turns the reserve off."""
    if config.disk_reserved_space == 0:
        return 0
    floor = config.entry_log_write_buffer + JOURNAL_CHUNK + (1 << 20)
    wanted = min(config.disk_reserved_space, int(total * RESERVE_SHARE))
    return min(max(wanted, floor), total // 4)


@dataclass(slots=True)
class _Filesystem:
    path: str  # a directory of the bookie's on it, where its reserve file lives
    reserve: int = 0  # bytes to set aside (0 until the size is known)
    held: bool = False  # the reserve file is in place

    @property
    def reserve_path(self) -> str:
        return os.path.join(self.path, RESERVE_FILE)


class DiskMonitor:
    def __init__(
        self,
        config: BookieConfig,
        disk: Disk,
        state: WriteState,
        journal: Journal,
        stats: BookieStats,
        collect_garbage: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._config = config
        self._disk = disk
        self._state = state
        self._journal = journal
        self._stats = stats
        self._collect_garbage = collect_garbage
        self._filesystems: list[_Filesystem] = []
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._gc: asyncio.Task[object] | None = None
        self._checks = TaskKeeper()
        self._last_forced_gc: float | None = None
        self.last: Verdict | None = None
        journal.on_failure = self.journal_failed

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Find the filesystems, then check once before anything is written at boot: on a
        full disk the reserve is released first and the bookie boots read-only."""
        seen: set[int] = set()
        for path in (self._config.data_dir, self._config.journal_path):
            await self._disk.makedirs(path)
            fs_id = await self._disk.filesystem(path)
            if fs_id not in seen:
                seen.add(fs_id)
                filesystem = _Filesystem(path)
                filesystem.held = await self._disk.exists(filesystem.reserve_path)
                self._filesystems.append(filesystem)
        await self.check()

    def run(self) -> None:
        """Check every ``disk_check_interval`` until ``stop``."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="disk-monitor")

    async def stop(self) -> None:
        for task in (self._task, self._gc, *self._checks):
            if task is not None:
                await cancel_and_wait(task, Exception)
        self._task = self._gc = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._config.disk_check_interval)
            try:
                await self.check()
            except OSError as exc:
                log.warning("disk check failed: %s", exc)

    # ------------------------------------------------------------------ checking

    async def _usages(self) -> list[Usage]:
        usages = []
        for fs in self._filesystems:
            free, total = await self._disk.usage(fs.path)
            if not fs.reserve:
                fs.reserve = reserve_size(self._config, total)
            if not fs.held:
                free = max(0, free - fs.reserve)  # as if the reserve were in place
            usages.append(Usage(fs.path, free, total))
        return usages

    async def check(self) -> Verdict:
        """Measure, decide, act: read-only or writable, reserves, forced garbage collection,
        journal recovery."""
        async with self._lock:
            state = self._state
            verdict = judge(await self._usages(), self._config, state.is_set(DISK))
            self.last = verdict
            state.room_for_high_priority = verdict.room_for_high_priority
            if verdict.full:
                if not state.is_set(DISK):
                    log.warning("read-only: %s", verdict.why)
                state.set(DISK, verdict.why)
                await self._release_reserves()
            else:
                if self._journal.failed is not None and await self._journal.recover():
                    state.clear(JOURNAL)
                if self._journal.failed is None:
                    if state.is_set(DISK):
                        log.warning("writable again: every disk is under its low-water mark")
                    state.clear(DISK)
                    await self._hold_reserves()
            if verdict.warn:
                self._force_gc()
            return verdict

    def report(self, exc: OSError) -> None:
        """An ENOSPC (or quota) from a write: read-only now, then a check."""
        if exc.errno not in NO_SPACE:
            return
        self._stats.disk_full_errors += 1
        if not self._state.is_set(DISK):
            log.error("read-only: a write found no space left (%s)", exc.strerror or exc)
        self._state.set(DISK, f"a write found no space left ({exc.strerror or exc})")
        if self._checks:
            return  # one is on its way: failures in a burst need one check, not one each
        self._checks.spawn(self._check_quietly(), name="disk-check")

    def journal_failed(self, exc: BaseException) -> None:
        """``Journal.on_failure``: read-only until it recovers."""
        self._state.set(JOURNAL, str(exc))
        if isinstance(exc, OSError):
            self.report(exc)

    async def _check_quietly(self) -> None:
        try:
            await self.check()
        except OSError as exc:
            log.warning("disk check failed: %s", exc)

    # ------------------------------------------------------------------ reserve, GC

    async def _release_reserves(self) -> None:
        for fs in self._filesystems:
            if fs.held:
                with contextlib.suppress(FileNotFoundError):
                    await self._disk.remove(fs.reserve_path)
                fs.held = False
                log.warning("released the %d-byte disk reserve in %s", fs.reserve, fs.path)

    async def _hold_reserves(self) -> None:
        for fs in self._filesystems:
            if not fs.held and fs.reserve > 0:
                try:
                    await self._disk.allocate(fs.reserve_path, fs.reserve)
                except OSError as exc:
                    log.warning("cannot set the disk reserve aside in %s: %s", fs.path, exc)
                    continue
                fs.held = True

    def _force_gc(self) -> None:
        """At most one pass per ``disk_check_interval``: a pass that cannot write (its
        checkpoint meets the full disk and reports it, which checks again) must not turn
        into a loop of passes."""
        if self._collect_garbage is None or (self._gc is not None and not self._gc.done()):
            return
        now = asyncio.get_running_loop().time()
        last = self._last_forced_gc
        if last is not None and now - last < self._config.disk_check_interval:
            return
        self._last_forced_gc = now
        self._stats.gc_forced += 1
        log.info("disk usage over the warning threshold: forcing garbage collection")
        self._gc = asyncio.get_running_loop().create_task(self._run_gc(), name="forced-gc")

    async def _run_gc(self) -> object:
        try:
            return await self._collect_garbage() if self._collect_garbage is not None else None
        except Exception as exc:  # a pass that fails is logged; the next check tries again
            log.warning("forced garbage collection failed: %s", exc)
            return None
