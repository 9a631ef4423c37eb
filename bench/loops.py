"""Load loops shared by the benchmarks that compare systems (``aiobk bench peers``).

Each system is reduced to one coroutine function, ``append(payload)``, that returns once the
system has acknowledged the payload. Two ways of driving it:

- **closed loop** (``closed_loop``): ``in_flight`` workers, each awaiting its append before
  sending the next, for a fixed time. Latency runs from the call to its return. This is what
  ``aiobk bench add`` does, and it measures the most a system gives at that concurrency.
- **open loop** (``open_loop``): appends at a fixed offered rate, the i-th intended at
  ``start + i / rate`` whatever happened to the ones before, and its latency runs from that
  *intended* time. A closed loop stops sending while the system stalls, so a stall costs a
  few samples one long latency each and the percentiles hide it (coordinated omission); an
  open loop keeps offering, and every append that had to wait shows the wait.

The open loop keeps at most ``cap`` appends outstanding (a real client has a bounded pool
too: redis-py would open a connection per outstanding command). When the cap is reached the
next sends wait, and since latency counts from the intended time, that wait is in the figures.
Appends not finished when the level is cut off (``seconds`` plus a drain limit) are counted as
``unfinished`` and recorded at the time they had waited by then: a lower bound, never omitted.

No append is sent before its intended time. uvloop's timers have millisecond resolution, so
the loop sleeps at least a millisecond at a time and sends every append that has come due when
it wakes: up to about a millisecond late, and never spinning (a client busy-waiting for the
exact time would take a core from the servers on a 2-core machine). The client's own
lateness, from the intended time to the call, is recorded apart (``send_lag``); it is part of
the latency, as it would be for an application that produced appends at that pace.

Every loop is bounded in count (``MAX_OPS``) and in time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hdrh.histogram import HdrHistogram

from aiobk.bench.floors import new_histogram

Append = Callable[[bytes], Awaitable[object]]
MAX_OPS = 5_000_000  # per level: a bound on every loop, far above what 2 cores reach
MAX_LATENCY_US = 59_999_999  # the histogram's range (new_histogram: up to 60 s)


def _record(histogram: HdrHistogram, nanoseconds: int) -> None:
    histogram.record_value(min(MAX_LATENCY_US, max(1, nanoseconds // 1000)))


@dataclass
class LoopResult:
    """One level of one system: its latencies (microseconds) and counts."""

    ops: int
    errors: int
    seconds: float
    latency: HdrHistogram = field(default_factory=new_histogram)
    # Open loop only: how late each append was sent after its intended time (the client's
    # own share of the latency: timer resolution, a full cap), and those cut off.
    send_lag: HdrHistogram = field(default_factory=new_histogram)
    unfinished: int = 0

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


async def closed_loop(
    append: Append,
    payload: bytes,
    in_flight: int,
    seconds: float,
    tick: Callable[[float], None] = lambda _done: None,
    grace: float = 30.0,
) -> LoopResult:
    """``in_flight`` workers appending back to back for ``seconds``; ``tick(fraction)`` is
    called about five times a second with the share of the time gone. A worker whose append
    fails stops (counted in ``errors``), as in ``aiobk bench add``: a broken system's level
    ends instead of spinning on errors."""
    loop = asyncio.get_running_loop()
    result = LoopResult(0, 0, 0.0)
    started = loop.time()
    deadline = started + seconds

    async def worker() -> None:
        while loop.time() < deadline and result.ops < MAX_OPS:
            sent = time.perf_counter_ns()
            try:
                await append(payload)
            except Exception:  # a benchmark counts failures instead of stopping
                result.errors += 1
                return
            _record(result.latency, time.perf_counter_ns() - sent)
            result.ops += 1

    async def ticker() -> None:
        while loop.time() < deadline:
            tick(min(1.0, (loop.time() - started) / seconds))
            await asyncio.sleep(0.2)

    ticking = asyncio.ensure_future(ticker())
    workers = [asyncio.ensure_future(worker()) for _ in range(in_flight)]
    try:
        # A worker ends at the deadline once its append returns; one that never returns is
        # cut off ``grace`` seconds later and counted as unfinished.
        _done, pending = await asyncio.wait(workers, timeout=seconds + grace)
        result.unfinished = len(pending)
    finally:
        for task in (ticking, *workers):
            task.cancel()
        # The workers' cancellations come back as results; a cancellation of this task while
        # it waits for them (Ctrl-C) propagates: swallowed, the benchmark went on.
        await asyncio.gather(ticking, *workers, return_exceptions=True)
    result.seconds = loop.time() - started
    tick(1.0)
    return result


def intended_offsets_ns(rate: float, seconds: float) -> list[int]:
    """When each append of an open-loop level is due, in nanoseconds from its start."""
    count = min(MAX_OPS, max(1, round(rate * seconds)))
    interval = 1e9 / rate
    return [round(index * interval) for index in range(count)]


async def open_loop(
    append: Append,
    payload: bytes,
    rate: float,
    seconds: float,
    cap: int,
    drain: float,
    tick: Callable[[float], None] = lambda _done: None,
) -> LoopResult:
    """Appends offered at ``rate`` per second for ``seconds``, at most ``cap`` outstanding;
    the level is cut off ``drain`` seconds after the last intended send."""
    loop = asyncio.get_running_loop()
    offsets = intended_offsets_ns(rate, seconds)
    result = LoopResult(0, 0, 0.0)
    slots = asyncio.Semaphore(cap)
    outstanding: dict[asyncio.Task[None], int] = {}  # task -> its intended time
    start_ns = time.perf_counter_ns()
    started = loop.time()
    cutoff = started + seconds + drain
    last_done_ns = start_ns

    async def one(intended_ns: int) -> None:
        nonlocal last_done_ns
        try:
            await append(payload)
        except Exception:  # counted, as in the closed loop
            result.errors += 1
            return
        finally:
            slots.release()
        last_done_ns = time.perf_counter_ns()
        _record(result.latency, last_done_ns - intended_ns)
        result.ops += 1

    sent = 0
    try:
        async with asyncio.timeout_at(cutoff):
            for index, offset in enumerate(offsets):
                intended_ns = start_ns + offset
                # Never early: uvloop's timers round to the millisecond (a 0.4 ms sleep ends
                # at once), so a sleep is at least one, and the loop sleeps again if it woke
                # too soon. What lateness remains is in ``send_lag``.
                # (ASYNC110: this waits for a time, there is no event to wait on.)
                while (early := intended_ns - time.perf_counter_ns()) > 0:  # noqa: ASYNC110
                    await asyncio.sleep(max(early, 1_000_000) / 1e9)
                await slots.acquire()
                _record(result.send_lag, time.perf_counter_ns() - intended_ns)
                task = asyncio.ensure_future(one(intended_ns))
                outstanding[task] = intended_ns
                task.add_done_callback(outstanding.pop)
                sent = index + 1
                if index % 256 == 0:
                    tick(min(1.0, offset / 1e9 / seconds))
            if outstanding:
                await asyncio.wait(list(outstanding))
    except TimeoutError:
        pass
    finally:
        cut_ns = time.perf_counter_ns()
        late = list(outstanding.items())
        for task, _intended in late:
            task.cancel()
        if late:
            await asyncio.gather(*(task for task, _ in late), return_exceptions=True)
    # Cut off: recorded at what they had waited by now (a lower bound), never left out.
    for _task, intended_ns in late:
        _record(result.latency, cut_ns - intended_ns)
    for offset in offsets[sent:]:
        _record(result.latency, max(1000, cut_ns - start_ns - offset))
    result.unfinished = len(late) + len(offsets) - sent
    result.seconds = max(1e-9, (last_done_ns - start_ns) / 1e9)
    tick(1.0)
    return result
