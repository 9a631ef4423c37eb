"""Figures a client keeps about its own work (``BookKeeper.stats``): plain counters and an append
latency histogram, cheap enough for every append. The client exports nothing itself;
``aiobk.metrics.register_client_metrics`` puts them on an application's Prometheus registry.

Durations come from ``ClientStats.clock``: the running event loop's by default (virtual in the
simulator, so a seed replays the same figures); ``register_client_metrics`` hands in a monotonic
clock of full resolution, as uvloop's loop clock counts whole milliseconds. A connected client
reads its loop's clock through the loop's own ``time`` (``bound_to_loop``), a third of
``loop_clock``'s cost per reading.

``Histogram`` is the bookie's (``aiobk.bookie.histogram``) over again: the client and the bookie
are independent layers (pyproject.toml's import contracts), and ``protocol`` is the codec's. A
test holds the two to the same behaviour and bounds.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from itertools import pairwise

# Seconds, 10 us to 168 s by doubling (the bookie's LATENCY_BOUNDS).
LATENCY_BOUNDS = tuple(10 * 2**i / 1_000_000 for i in range(25))


class Histogram:
    """Fixed buckets: ``counts[i]`` holds values in (``bounds[i-1]``, ``bounds[i]``], the last
    one those above every bound (+Inf); ``sum`` their total."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS) -> None:
        if not bounds or any(b <= a for a, b in pairwise(bounds)):
            raise ValueError("bounds must be one or more strictly increasing numbers")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def record(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def __repr__(self) -> str:
        count = self.count
        mean = f", mean={self.sum / count:.6g}" if count else ""
        return f"Histogram(count={count}, sum={self.sum:.6g}{mean})"

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, values at or below it), ending with (inf, count)."""
        running = 0
        out = []
        for bound, count in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            running += count
            out.append((bound, running))
        return out


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


@dataclass(slots=True)
class ClientStats:
    appends: int = 0  # confirmed to their caller
    append_bytes: int = 0  # payload of those
    append_failures: int = 0  # appends failed (fenced, closed, a failed ensemble change, ...)
    ensemble_changes: int = 0  # new fragments this client's writers put in the metadata
    recoveries: int = 0  # ledgers this client recovered and closed (or found closed) on open
    recovery_failures: int = 0
    entries_read: int = 0
    speculative_reads: int = 0  # a next bookie asked because the first was slow
    # Not counters (``as_dict`` leaves them out):
    append_latency: Histogram = field(default_factory=Histogram)  # add -> confirmed, seconds
    clock: Clock = field(default=loop_clock, repr=False)  # times the histogram (module doc)

    def as_dict(self) -> dict[str, int]:
        """The counters."""
        return {name: getattr(self, name) for name in COUNTERS}


COUNTERS = tuple(f.name for f in fields(ClientStats) if f.type == "int")

__all__ = [
    "COUNTERS",
    "LATENCY_BOUNDS",
    "ClientStats",
    "Clock",
    "Histogram",
    "bound_to_loop",
    "loop_clock",
]
