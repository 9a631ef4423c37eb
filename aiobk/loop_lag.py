"""Event-loop lag: how late the loop runs what is due, the figure behind every other latency
of an asyncio process (a blocking call, a long callback or a starved CPU shows here first).

One task per loop sleeps ``INTERVAL`` at a time -- a plain ``asyncio.sleep``, no timeout
around it -- and records how much later than scheduled it woke, by the loop's own clock (the
clock its timers run on; the wall clock jumps). uvloop's clock counts whole milliseconds, so
lags below a millisecond read as 0 or 1 ms there. The histogram is the client's
(``aiobk.client.stats.Histogram``, seconds from 10 us to 168 s); the exporter reads it at scrape
time from its own thread (``aiobk.metrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref

from aiobk.client.stats import Histogram

INTERVAL = 0.5  # seconds between wake-ups: a lag shorter than a scrape still lands in a bucket


class LoopLag:
    """The lag histogram of one loop, and the task that fills it."""

    def __init__(self) -> None:
        self.histogram = Histogram()
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._measure(loop), name="event-loop-lag")

    async def _measure(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            due = loop.time() + INTERVAL
            await asyncio.sleep(INTERVAL)
            self.histogram.record(max(0.0, loop.time() - due))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


_monitors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLag] = (
    weakref.WeakKeyDictionary()
)


def loop_lag(loop: asyncio.AbstractEventLoop | None = None) -> LoopLag:
    """The lag monitor of ``loop`` (the running one by default), started on first use: one per
    loop, however many bookies, services or clients share it."""
    loop = loop or asyncio.get_running_loop()
    monitor = _monitors.get(loop)
    if monitor is None:
        monitor = _monitors[loop] = LoopLag()
    monitor.start(loop)
    return monitor


__all__ = ["INTERVAL", "LoopLag", "loop_lag"]
