"""Figures a client keeps about its own work (``BookKeeper.stats``): plain counters and an append
latency histogram, cheap enough for every append. The client exports nothing itself;
``aiobk.metrics.register_client_metrics`` puts them on an application's Prometheus registry.

Durations come from ``ClientStats.clock``: the running event loop's by default (virtual in the
simulator, so a seed replays the same figures); ``register_client_metrics`` hands in a monotonic
clock of full resolution, as uvloop's loop clock counts whole milliseconds. A connected client
reads its loop's clock through the loop's own ``time`` (``bound_to_loop``), a third of
``loop_clock``'s cost per reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from aiobk.figures import LATENCY_BOUNDS, Clock, Histogram, bound_to_loop, loop_clock


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
    # ensembles and replacements placed on fewer racks than min_racks_per_write_quorum asks
    placement_short_of_racks: int = 0
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
