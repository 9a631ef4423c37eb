"""The figures the bookie and the client keep: the clock that times them and the fixed-bucket
histogram that holds the times (pure: asyncio for the loop's clock, no I/O, no locks).

One copy for both: the bookie and the client are independent layers, so what they share sits
below them, beside ``aiobk.tasks``. No exporter is imported here (``aiobk.metrics`` reads the
figures at scrape time), so the base install imports it.

Bucket ``i`` counts the values ``v`` with ``bounds[i-1] < v <= bounds[i]`` (Prometheus' ``le``);
the last one, past the highest bound, is ``+Inf``. Recording is one ``bisect`` over a short tuple
and two additions; nothing is allocated. Only the event loop records; the exporter copies
``counts`` and reads ``sum`` from its own thread at scrape time, so a scrape may see a value
counted whose sum is not added yet, never a lost count.

Durations are measured by the caller with its stats' ``clock`` (``BookieStats.clock``,
``ClientStats.clock``), never by the histogram: by default ``loop_clock``, the running event
loop's, which the simulator makes virtual, so a seed replays the same figures.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable
from itertools import pairwise

Clock = Callable[[], float]


def loop_clock() -> float:
    """The running event loop's clock (virtual in the simulator)."""
    return asyncio.get_running_loop().time()


def bound_to_loop(clock: Clock) -> Clock:
    """``clock``, unless it reads an event loop's clock (``loop_clock``, or some loop's
    ``time``): then the running loop's ``time`` itself, which skips looking the loop up."""
    owner = getattr(clock, "__self__", None)
    if clock is loop_clock or isinstance(owner, asyncio.AbstractEventLoop):
        return asyncio.get_running_loop().time
    return clock


def exponential_bounds(start: int, factor: int, count: int, unit: int = 1) -> tuple[float, ...]:
    """``count`` upper bounds ``start * factor**i / unit``: integers divided once, so each bound
    is the nearest float to its exact value (``640 / 1e6`` prints as 0.00064, not
    0.0006400000000000001) and the ``le`` labels read cleanly."""
    if start <= 0 or factor < 2 or count < 1 or unit < 1:
        raise ValueError("need start > 0, factor >= 2, count >= 1, unit >= 1")
    return tuple(start * factor**i / unit for i in range(count))


# Seconds, 10 us to 168 s by doubling: an fdatasync, an add, a read from the page cache or the
# disk, and a long poll up to max_long_poll_timeout (120 s) all land inside the bounds.
LATENCY_BOUNDS = exponential_bounds(10, 2, 25, unit=1_000_000)
# Records in one journal write: 1 to 65,536.
BATCH_ENTRIES_BOUNDS = exponential_bounds(1, 2, 17)
# Bytes in one journal write: 512 B to 128 MiB.
BATCH_BYTES_BOUNDS = exponential_bounds(512, 2, 19)


class Histogram:
    """Fixed buckets: ``counts[i]`` holds values in (``bounds[i-1]``, ``bounds[i]``], the last
    one those above every bound (+Inf); ``sum`` their total."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS) -> None:
        if not bounds or any(b <= a for a, b in pairwise(bounds)):
            raise ValueError("bounds must be one or more strictly increasing numbers")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def record(self, value: float, count: int = 1) -> None:
        """``count`` observations of ``value``."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count

    @property
    def count(self) -> int:
        return sum(self.counts)

    def __repr__(self) -> str:
        count = self.count
        mean = f", mean={self.sum / count:.6g}" if count else ""
        return f"Histogram(count={count}, sum={self.sum:.6g}{mean})"

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, values at or below it), ending with (inf, count): the exposition's
        ``_bucket`` series, from one copy of the counts."""
        running = 0
        out = []
        for bound, count in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            running += count
            out.append((bound, running))
        return out


def latency_histogram() -> Histogram:
    return Histogram(LATENCY_BOUNDS)


__all__ = [
    "BATCH_BYTES_BOUNDS",
    "BATCH_ENTRIES_BOUNDS",
    "LATENCY_BOUNDS",
    "Clock",
    "Histogram",
    "bound_to_loop",
    "exponential_bounds",
    "latency_histogram",
    "loop_clock",
]
