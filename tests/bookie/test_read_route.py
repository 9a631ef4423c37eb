"""Where a small cold read waits: on the event loop or on a thread (bookie.read_route), pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiobk.bookie.read_route import ReadRoute

US = 1000


def _routed(route: ReadRoute, reads: int) -> list[bool]:
    return [route.inline() for _ in range(reads)]


def test_nothing_measured_takes_a_thread() -> None:
    route = ReadRoute()
    assert _routed(route, 5) == [False] * 5
    route.read_inline(10 * US)  # a disk figure alone says nothing of the hop
    assert not route.inline()


def test_a_disk_faster_than_the_hop_reads_inline_but_still_probes_the_thread() -> None:
    route = ReadRoute(probe_every=8)
    route.read_on_thread(total_ns=150 * US, disk_ns=65 * US)  # hop 85 us, disk 65 us
    routes = _routed(route, 64)
    assert routes.count(False) == 8  # one in eight keeps the hop's figure current
    assert all(routes[i] is (i % 8 != 7) for i in range(64))


def test_a_slow_disk_always_takes_a_thread() -> None:
    route = ReadRoute()
    route.read_on_thread(total_ns=5_080 * US, disk_ns=5_000 * US)  # a spinning disk
    assert not any(_routed(route, 100))


def test_no_read_holds_the_loop_past_max_inline_even_if_the_hop_is_slower() -> None:
    route = ReadRoute(max_inline_us=250)
    route.read_on_thread(total_ns=2_300 * US, disk_ns=300 * US)  # a starved machine's hop
    assert not any(_routed(route, 100))


def test_a_disk_turning_slow_moves_reads_back_to_threads_within_a_few_reads() -> None:
    route = ReadRoute()
    route.read_on_thread(total_ns=150 * US, disk_ns=65 * US)
    assert route.inline()
    reads = 0
    while route.inline():
        route.read_inline(3_000 * US)  # contention: each inline read now takes 3 ms
        reads += 1
    assert reads <= 2
    for _ in range(40):  # the disk recovers; threads keep measuring it
        route.read_on_thread(total_ns=150 * US, disk_ns=60 * US)
    assert route.inline()


def test_inline_reads_at_page_cache_speed_leave_the_disk_figure_alone() -> None:
    """Reads inline are not probed first, so some come from the page cache: a run of them
    must not make a slow disk look fast (and keep sending its reads to the loop)."""
    route = ReadRoute(cached_below_us=10)
    route.read_on_thread(total_ns=300 * US, disk_ns=200 * US)
    for _ in range(100):
        route.read_inline(3 * US)  # cached
    assert route.disk_ns == 200 * US
    route.read_inline(120 * US)  # the disk
    assert route.disk_ns is not None
    assert 120 * US < route.disk_ns < 200 * US


@given(
    st.lists(
        st.tuples(st.integers(0, 10_000_000), st.integers(0, 10_000_000), st.booleans()),
        min_size=1,
        max_size=200,
    )
)
def test_the_averages_stay_within_what_was_seen(samples: list[tuple[int, int, bool]]) -> None:
    route = ReadRoute(cached_below_us=0)  # every sample counts
    disks, hops = [], []
    for first, second, on_thread in samples:
        if on_thread:
            total, disk = max(first, second), min(first, second)
            route.read_on_thread(total, disk)
            hops.append(total - disk)
        else:
            disk = first
            route.read_inline(disk)
        disks.append(disk)
    assert route.disk_ns is not None
    assert min(disks) <= route.disk_ns <= max(disks)
    if hops:
        assert route.hop_ns is not None
        assert min(hops) <= route.hop_ns <= max(hops)
