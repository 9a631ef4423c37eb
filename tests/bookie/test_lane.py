"""A lane (bookie/lane.py): calls run on one thread in the order handed over, their results and
exceptions come back to their callers, a cancelled caller's call still runs, and closing runs
what was handed over first."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aiobk.bookie.lane import Lane, LaneClosedError

pytestmark = pytest.mark.timeout(30)


async def test_calls_run_in_order_on_one_thread_and_return_their_results() -> None:
    lane = Lane("test")
    seen: list[tuple[int, str]] = []

    def call(n: int) -> int:
        seen.append((n, threading.current_thread().name))
        return n * n

    try:
        results = await asyncio.gather(*(lane.run(call, n) for n in range(200)))
    finally:
        lane.close()
    assert results == [n * n for n in range(200)]
    assert [n for n, _ in seen] == list(range(200))
    assert {name for _, name in seen} == {"aiobk-test"}
    assert threading.main_thread().name not in {name for _, name in seen}


async def test_an_exception_reaches_its_caller_and_the_lane_goes_on() -> None:
    lane = Lane("test")

    def fail() -> None:
        raise OSError(28, "No space left on device")

    try:
        with pytest.raises(OSError, match="No space left") as caught:
            await lane.run(fail)
        assert caught.value.errno == 28
        assert await lane.run(len, b"abc") == 3
    finally:
        lane.close()


async def test_a_cancelled_callers_call_still_runs_in_its_place() -> None:
    lane = Lane("test")
    order: list[str] = []
    gate = threading.Event()
    try:
        first = asyncio.ensure_future(lane.run(gate.wait, 5))
        second = lane.run(order.append, "second")
        third = lane.run(order.append, "third")
        second.cancel()  # its caller gave up: the call was handed over, it runs
        gate.set()
        assert await first is True
        await third
        assert order == ["second", "third"]
        assert second.cancelled()
    finally:
        lane.close()


async def test_close_runs_what_was_handed_over_then_refuses_more() -> None:
    lane = Lane("test")
    done: list[int] = []
    lane.run(time.sleep, 0.05)
    lane.run(done.append, 1)
    lane.close()  # blocks until the thread is gone
    assert done == [1]
    with pytest.raises(LaneClosedError, match="lane test is closed"):
        lane.run(done.append, 2)
    lane.close()  # again: nothing to do
    Lane("never-used").close()  # no thread was started


def test_a_call_whose_loop_has_closed_leaves_the_lane_working() -> None:
    lane = Lane("test")
    gate = threading.Event()
    loop = asyncio.new_event_loop()

    async def hand_over() -> None:
        lane.run(gate.wait, 5)  # answers after the loop is closed

    loop.run_until_complete(hand_over())
    loop.close()
    gate.set()

    async def after() -> int:
        return await lane.run(len, b"ab")

    try:
        assert asyncio.run(after()) == 2
    finally:
        lane.close()
