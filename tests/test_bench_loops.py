"""The load loops of ``aiobk bench peers`` (bench/loops.py) against fake systems: the open
loop measures from the intended send time, so a stall shows in every append it delays, and
appends cut off are counted and recorded, never left out."""

from __future__ import annotations

import asyncio
import time

from aiobk.bench.add import Floors
from aiobk.bench.loops import closed_loop, intended_offsets_ns, open_loop
from aiobk.bench.peers import Run, check_targets


def test_intended_offsets_are_evenly_spaced_and_bounded() -> None:
    assert intended_offsets_ns(1000, 0.005) == [0, 1_000_000, 2_000_000, 3_000_000, 4_000_000]
    assert intended_offsets_ns(0.1, 1) == [0]  # at least one append per level


async def test_the_open_loop_never_sends_early() -> None:
    calls: list[int] = []

    async def append(_payload: bytes) -> None:
        calls.append(time.perf_counter_ns())

    started = time.perf_counter_ns()
    result = await open_loop(append, b"x", rate=2000, seconds=0.05, cap=8, drain=1)
    assert result.ops == len(calls) == 100
    assert result.unfinished == 0
    offsets = intended_offsets_ns(2000, 0.05)
    # Each call at or after its intended time (measured from a start no later than the loop's).
    assert all(call >= started + offset for call, offset in zip(calls, offsets, strict=True))


async def test_a_stall_shows_in_every_append_it_delays_and_the_cut_off_are_counted() -> None:
    """One append outstanding at most, each taking 20 ms, 200 offered per second for 0.1 s:
    a closed loop would record 20 ms each; the open loop sees the queue grow."""

    async def append(_payload: bytes) -> None:
        await asyncio.sleep(0.02)  # the append's service time: the latencies are durations

    result = await open_loop(append, b"x", rate=200, seconds=0.1, cap=1, drain=0.05)
    assert result.unfinished > 0
    assert result.ops + result.unfinished == 20
    assert result.latency.get_total_count() == 20  # the cut off ones too, at a lower bound
    assert result.latency.get_value_at_percentile(99) > 100_000  # us: the queue, not 20 ms
    closed = await closed_loop(append, b"x", in_flight=1, seconds=0.1)
    assert closed.latency.get_value_at_percentile(99) < 60_000


async def test_a_failing_append_is_counted_and_ends_its_worker() -> None:
    async def append(_payload: bytes) -> None:
        raise ConnectionError("down")

    closed = await closed_loop(append, b"x", in_flight=4, seconds=5)
    assert (closed.ops, closed.errors) == (0, 4)
    opened = await open_loop(append, b"x", rate=100, seconds=0.05, cap=4, drain=1)
    assert (opened.ops, opened.errors, opened.unfinished) == (0, 5, 0)


def _run(system: str, in_flight: int, rate: float, p50: int, cpu: float = 100.0) -> Run:
    return Run(system, "closed", in_flight, 1000, 1.0, rate, p50, p50, p50, p50, 0, cpu / 2,
               cpu / 2)  # fmt: skip


def test_the_targets_are_ratios_of_the_same_run() -> None:
    floors = Floors(fdatasync_us=400, loopback_rtt_us=50, quorum_fdatasync_us=800)
    runs = [
        _run("nats", 1, 1000, 800), _run("nats", 512, 4000, 30_000),
        _run("aiobk-persistent", 1, 900, 780), _run("aiobk-persistent", 512, 12_000, 40_000),
        _run("aiobk-volatile", 1, 1500, 600), _run("aiobk-volatile", 512, 20_000, 20_000),
        _run("etcd-3", 512, 1000, 100_000), _run("aiobk-pure", 512, 9000, 50_000, 250.0),
    ]  # fmt: skip
    nats_open = Run("nats", "open", 512, 100, 1.0, 100, 900, 5000, 6000, 7000, 0, 1, 1,
                    offered_per_s=4000, rate_of_nats=0.5)  # fmt: skip
    ours_open = Run("aiobk-persistent", "open", 512, 100, 1.0, 100, 900, 4000, 6000, 7000, 0,
                    1, 1, offered_per_s=4000, rate_of_nats=0.5)  # fmt: skip
    checks = check_targets(floors, [*runs, nats_open, ours_open], 300.0)
    assert [(c["ratio"], c["pass"]) for c in checks] == [
        (3.0, True),  # 12000 / 4000 >= 3
        (12.0, True),  # 12000 / 1000 >= 8
        (5.0, True),  # 20000 / 4000 >= 3
        (0.92, True),  # 780 / (800 + 50) <= 1.5
        (0.97, True),  # 780 / 800 <= 1: NATS's p50
        (0.75, True),  # 600 / 800 <= 0.8
        (0.8, True),  # p99 4000 / 5000 <= 1
        (0.4, True),  # CPU 100 / 250 (AIOBK_NO_EXTENSIONS=1, same run) <= 0.5
        (0.33, True),  # CPU 100 / 300 <= 0.5
    ]
    assert checks[7]["pure_cpu_us"] == 250.0
    runs[1] = _run("nats", 512, 4001, 30_000)
    assert not check_targets(floors, runs, 300.0)[0]["pass"]  # just below 3x
    assert check_targets(floors, runs[:1], 300.0) == []  # nothing to compare: nothing checked
    # A 1-in-flight level with the quorum floor measured beside it is judged against that one.
    runs[2].quorum_floor_us = 1000
    (beside,) = [c for c in check_targets(floors, runs, 300.0) if "quorum floor" in c["target"]]
    assert (beside["ratio"], beside["quorum_floor_us"]) == (0.78, 1000)
    assert beside["run_start_quorum_floor_us"] == 850


async def test_an_append_that_never_returns_is_cut_off_in_the_closed_loop() -> None:
    async def append(_payload: bytes) -> None:
        await asyncio.Event().wait()

    result = await closed_loop(append, b"x", in_flight=3, seconds=0.05, grace=0.05)
    assert (result.ops, result.unfinished) == (0, 3)


async def test_a_cancel_while_the_closed_loop_winds_down_is_not_swallowed() -> None:
    """Ctrl-C reaches a benchmark as a cancellation of its main task; one landing while the
    loop waits for its cancelled workers must still end the benchmark (it once returned a
    result instead, and `bench peers` went on to exit 0 after a SIGINT)."""
    winding_down = asyncio.Event()
    cancelled = asyncio.Event()

    async def append(_payload: bytes) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            winding_down.set()
            await cancelled.wait()  # a worker slow to stop: still stopping when the cancel lands
            raise

    task = asyncio.ensure_future(closed_loop(append, b"x", in_flight=2, seconds=0.02, grace=0.02))
    await asyncio.wait_for(winding_down.wait(), 5)
    task.cancel()
    cancelled.set()
    done, _pending = await asyncio.wait([task], timeout=5)
    assert done
    assert task.cancelled()
