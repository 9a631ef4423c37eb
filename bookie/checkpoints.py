"""Checkpoints (BookKeeper's SyncThread): make what the journal holds durable in ledger storage,
then trim the journal behind it (``bookie.storage`` has the order that keeps the index from
naming unsynced bytes).

A failure is logged, counted (``checkpoint_failures``) and kept in ``error`` until a checkpoint
succeeds; the journal keeps every record the failed one did not cover, and the loop tries again
after ``CHECKPOINT_RETRY`` instead of the full ``flush_interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage

CHECKPOINT_RETRY = 1.0  # seconds before trying again after a failed checkpoint

log = logging.getLogger(__name__)


def describe(exc: BaseException) -> str:
    """``module.Class: message`` (builtins without their module)."""
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    return f"{name}: {exc}"


class Checkpoints:
    def __init__(
        self,
        storage: LedgerStorage,
        journal: Journal,
        stats: BookieStats,
        on_disk_error: Callable[[OSError], None],
    ) -> None:
        self.storage = storage
        self.journal = journal
        self.stats = stats
        self.on_disk_error = on_disk_error  # the disk monitor's report
        self.owner = ""  # the bookie id, for log lines
        self.error: str | None = None  # why the last checkpoint failed, until one works
        self._lock = asyncio.Lock()
        self._soon = asyncio.Event()  # the index's write cache is full: do not wait

    async def checkpoint(self, release: bool = True) -> None:
        """Make everything journaled so far durable in ledger storage; trim the journal
        (unless ``release`` is false: a stopping bookie keeps it, the next start needs none)."""
        async with self._lock:
            start = self.journal.position()  # before the mark: every record before it is older
            mark = self.journal.last_lsn
            try:
                await self.storage.checkpoint(mark, start)
            except Exception as exc:
                if isinstance(exc, OSError):
                    self.on_disk_error(exc)
                self.stats.checkpoint_failures += 1
                self.error = describe(exc)
                log.error(
                    "bookie %s: checkpoint failed (%d so far); the journal is kept until one "
                    "succeeds: %s",
                    self.owner,
                    self.stats.checkpoint_failures,
                    self.error,
                    exc_info=not isinstance(exc, OSError),
                )
                raise
            if self.error is not None:
                log.warning("bookie %s: checkpoints succeed again", self.owner)
                self.error = None
            if release:
                await self.journal.release(mark)

    def wake(self) -> None:
        """Checkpoint now rather than at the next interval (the write cache is full)."""
        self._soon.set()

    async def run(self, interval: float, after: Callable[[], Awaitable[None]]) -> None:
        """Checkpoint every ``interval`` (sooner after a failure or a ``wake``), then
        ``after()``."""
        while True:
            delay = interval if self.error is None else min(interval, CHECKPOINT_RETRY)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._soon.wait(), delay)
            self._soon.clear()
            with contextlib.suppress(Exception):  # counted and logged by checkpoint()
                await self.checkpoint()
            await after()


__all__ = ["CHECKPOINT_RETRY", "Checkpoints", "describe"]
