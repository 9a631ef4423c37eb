"""The journal's sync stage: the groups of written batches waiting for an fdatasync, the task
(``journal-sync``) that runs one fdatasync for every group written before it started, and the
BP-14 lazy groups -- batches of volatile records only -- that wait up to
``volatile_sync_delay`` for a sync other work brings anyway (see ``bookie.journal.journal``).
The writer stage goes on writing while this stage syncs; the failure state stays the
journal's, reached through the three callables it is given."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from aiobk.bookie.journal.batch import Batch, Callback, Group, notify
from aiobk.bookie.stats import BookieStats
from aiobk.tasks import cancel_and_wait


class SyncStage:
    def __init__(
        self,
        stats: BookieStats,
        volatile_sync_delay: float,
        *,
        fail: Callable[[OSError, list[Batch]], BaseException],
        failed: Callable[[], BaseException | None],
        stall: Callable[[Iterable[Batch]], None],
    ) -> None:
        self.stats = stats
        self._fail = fail  # stops the journal; returns the error callbacks get
        self._failed = failed  # why the journal stopped taking records, if it did
        self._stall = stall  # keeps failed batches, in order, for the journal's recover()
        self._groups: list[Group] = []
        # Written batches of volatile records only, waiting for a sync (see the module doc).
        self._lazy_groups: list[Group] = []
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._volatile_sync_delay = volatile_sync_delay
        self._syncing = False
        self._wakeup: asyncio.Future[None] | None = None
        self._idle: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def size(self) -> int:
        """Written batches (and barriers) waiting for an fdatasync."""
        return len(self._groups) + len(self._lazy_groups)

    def busy(self) -> bool:
        return self._syncing or bool(self._groups) or bool(self._lazy_groups)

    def submit(self, group: Group, *, lazy: bool = False) -> None:
        """Queue ``group`` for the next fdatasync. ``lazy``: it holds volatile records only, and
        may wait up to ``volatile_sync_delay`` for a sync that other work brings."""
        if lazy and self._volatile_sync_delay > 0:
            self._lazy_groups.append(group)
            if self._lazy_timer is None:
                loop = asyncio.get_running_loop()
                self._lazy_timer = loop.call_later(self._volatile_sync_delay, self._lazy_due)
            return
        self._promote_lazy()
        self._groups.append(group)
        self._wake()

    def _promote_lazy(self) -> None:
        """Hand waiting volatile batches to the sync stage. They were written after every group
        already there, so appending keeps the groups in write order."""
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        if self._lazy_groups:
            self._groups.extend(self._lazy_groups)
            self._lazy_groups = []

    def _lazy_due(self) -> None:
        self._lazy_timer = None
        self._promote_lazy()
        self._wake()

    def after_sync(self, callbacks: list[Callback]) -> None:
        """Run ``callbacks`` once every write so far is synced (now, if nothing is pending)."""
        if self.busy():
            self.submit((None, callbacks, None))
        else:
            notify(callbacks, self._failed())

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="journal-sync")

    async def run(self) -> None:
        """The sync stage: one fdatasync covers every batch written before it started."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._groups:
                for waiter in self._idle:
                    if not waiter.done():
                        waiter.set_result(None)
                self._idle.clear()
                if self._stopping:
                    return
                self._wakeup = loop.create_future()
                try:
                    await self._wakeup
                finally:
                    self._wakeup = None
                continue
            self._promote_lazy()  # written before this fdatasync: it covers them for free
            groups, self._groups = self._groups, []
            self._syncing = True
            error: BaseException | None = self._failed()
            try:
                if error is None:
                    stats = self.stats
                    for handle in dict.fromkeys(h for h, _cbs, _b in groups if h is not None):
                        started = stats.clock()
                        await handle.sync()
                        stats.histograms.journal_sync.record(stats.clock() - started)
                        stats.journal_syncs += 1
            except OSError as exc:
                error = self._fail(exc, [])
            finally:
                self._syncing = False
            if error is not None:
                # Not durable (a failed fdatasync may even have dropped the pages): written
                # again by recover(), in the order they were written.
                self._stall(b for _h, _cbs, b in groups if b is not None)
            for _handle, callbacks, _batch in groups:
                notify(callbacks, error)

    async def drain(self) -> None:
        """Wait until every group handed over so far is synced (or failed)."""
        if self.busy():
            self._promote_lazy()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            self._wake()
            await waiter

    async def drain_or_raise(self) -> None:
        """``drain``, then raise the journal's failure if it failed: a file is closed only once
        every fdatasync of what was written to it succeeded."""
        await self.drain()
        failed = self._failed()
        if failed is not None:
            raise failed

    async def stop(self) -> None:
        """Sync every group handed over, then end the task."""
        self._promote_lazy()
        self._stopping = True
        self._wake()
        if self._task is not None:
            await self._task
            self._task = None

    async def crash(self) -> None:
        """End the task at once: the groups waiting are neither synced nor answered."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        self._groups = []
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._lazy_groups = []
