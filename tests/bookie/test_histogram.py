"""The fixed-bucket histogram and the loop clock (``aiobk.figures``), as the bookie's and the
client's stats export them."""

from __future__ import annotations

import asyncio
import math
import time
from bisect import bisect_left
from itertools import pairwise
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiobk import figures
from aiobk.bookie import stats as bookie_stats
from aiobk.bookie.stats import COUNTERS, BookieStats
from aiobk.client import stats as client_stats
from aiobk.figures import (
    BATCH_BYTES_BOUNDS,
    BATCH_ENTRIES_BOUNDS,
    LATENCY_BOUNDS,
    Histogram,
    exponential_bounds,
)

IDS = ["bookie", "client"]


@pytest.mark.timeout(10)
def test_a_value_on_a_bound_counts_in_that_bounds_bucket() -> None:
    h = Histogram((1.0, 2.0, 4.0))
    for value in (0.0, 1.0, 1.5, 2.0, 4.0, 4.000001, 100.0):
        h.record(value)
    assert h.counts == [2, 2, 1, 2]  # le=1: 0, 1; le=2: 1.5, 2; le=4: 4; +Inf: the rest
    assert h.count == 7
    assert h.sum == pytest.approx(112.500001)
    assert h.cumulative() == [(1.0, 2), (2.0, 4), (4.0, 5), (math.inf, 7)]


@pytest.mark.timeout(10)
def test_an_empty_histogram() -> None:
    h = Histogram((0.5,))
    assert h.count == 0
    assert h.sum == 0.0
    assert h.cumulative() == [(0.5, 0), (math.inf, 0)]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bounds", [(), (1.0, 1.0), (2.0, 1.0)])
def test_bounds_must_increase(bounds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram(bounds)


@pytest.mark.timeout(60)
@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), max_size=200))
def test_counts_match_a_plain_count(values: list[float]) -> None:
    bounds = LATENCY_BOUNDS
    h = Histogram(bounds)
    for value in values:
        h.record(value)
    for i, (bound, running) in enumerate(h.cumulative()):
        assert running == sum(1 for v in values if v <= bound), (i, bound)
        if i < len(bounds):
            assert h.counts[i] == sum(1 for v in values if bisect_left(bounds, v) == i)
    assert h.count == len(values)
    assert h.sum == pytest.approx(math.fsum(values))


@pytest.mark.timeout(10)
def test_the_bounds_are_exponential_and_print_cleanly() -> None:
    bounds = LATENCY_BOUNDS
    assert bounds[0] == 0.00001
    assert all(later / earlier == pytest.approx(2.0) for earlier, later in pairwise(bounds))
    assert bounds[-1] >= 120.0  # the longest long poll (max_long_poll_timeout) fits
    assert repr(bounds[6]) == "0.00064"  # an le label as a person would write it
    assert BATCH_ENTRIES_BOUNDS[:3] == (1.0, 2.0, 4.0)
    assert BATCH_BYTES_BOUNDS[0] == 512.0
    assert Histogram().bounds == bounds  # the default: latencies
    with pytest.raises(ValueError, match="factor >= 2"):
        exponential_bounds(1, 1, 3)


@pytest.mark.timeout(10)
def test_the_bookie_and_the_client_keep_one_histogram_and_one_clock() -> None:
    """The same buckets on both sides, so dashboards compare like with like."""
    for module in (bookie_stats, client_stats):
        assert module.Histogram is Histogram
        assert module.loop_clock is figures.loop_clock
        assert module.bound_to_loop is figures.bound_to_loop
    assert client_stats.LATENCY_BOUNDS is LATENCY_BOUNDS
    bookie, client = BookieStats().histograms.add_entry_request, client_stats.ClientStats()
    assert bookie.bounds == client.append_latency.bounds == LATENCY_BOUNDS


@pytest.mark.timeout(10)
def test_stats_counters_leave_the_histograms_and_the_clock_out() -> None:
    stats = BookieStats()
    figures = stats.as_dict()
    assert set(figures) == set(COUNTERS)
    assert not {"histograms", "clock", "directories"} & set(figures)
    assert all(isinstance(v, int) for v in figures.values())
    assert set(stats.histograms.as_dict()) == {
        "add_entry_request",
        "read_entry",
        "read_entry_long_poll_wait",
        "journal_flush",
        "journal_sync",
        "journal_batch_entries",
        "journal_batch_bytes",
    }
    client = client_stats.ClientStats()
    assert set(client.as_dict()) == set(client_stats.COUNTERS)
    assert "append_latency" not in client.as_dict()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("module", [bookie_stats, client_stats], ids=IDS)
async def test_a_loop_clock_is_bound_to_the_running_loop_and_others_are_kept(
    module: ModuleType,
) -> None:
    loop = asyncio.get_running_loop()
    assert module.bound_to_loop(module.loop_clock) == loop.time
    other = asyncio.new_event_loop()
    try:
        assert module.bound_to_loop(other.time) == loop.time  # a loop's clock, not this one's
    finally:
        other.close()
    assert module.bound_to_loop(time.monotonic) is time.monotonic  # an exporter's choice
