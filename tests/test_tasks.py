"""``aiobk.tasks``: tasks kept until they end, walked in the order started; one task cancelled
and waited for."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.tasks import TaskKeeper, cancel_and_wait


async def test_tasks_are_kept_in_start_order_and_dropped_when_they_end() -> None:
    keeper = TaskKeeper()
    gates = [asyncio.Event() for _ in range(5)]
    tasks = [keeper.spawn(gate.wait(), name=f"t{i}") for i, gate in enumerate(gates)]
    assert list(keeper) == tasks
    assert len(keeper) == 5
    assert tasks[2].get_name() == "t2"
    gates[2].set()
    await tasks[2]
    await asyncio.sleep(0)  # the done callback runs on the next loop turn
    assert list(keeper) == [tasks[0], tasks[1], tasks[3], tasks[4]]
    outside = asyncio.get_running_loop().create_task(gates[0].wait())
    keeper.keep(outside)
    assert list(keeper)[-1] is outside
    await keeper.cancel_and_wait()
    assert all(task.cancelled() for task in tasks if task is not tasks[2])
    await asyncio.sleep(0)
    assert len(keeper) == 0
    assert not keeper


async def test_cancel_asks_and_the_tasks_leave_on_a_later_turn() -> None:
    keeper = TaskKeeper()
    task = keeper.spawn(asyncio.sleep(60))
    for kept in keeper:  # a copy: cancelling while walking is safe
        kept.cancel()
    keeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert len(keeper) == 0


async def test_cancel_and_wait_swallows_only_the_named_failures() -> None:
    class Expected(Exception):
        pass

    async def fails(exc: Exception) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            raise exc

    keeper = TaskKeeper()
    keeper.spawn(fails(Expected("fine")))
    await asyncio.sleep(0)  # started: cancelled inside, its finally raises
    await keeper.cancel_and_wait(Expected)
    keeper.spawn(fails(ValueError("not expected")))
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="not expected"):
        await keeper.cancel_and_wait(Expected)


async def test_a_caller_cancelled_while_it_waits_for_the_tasks_is_cancelled() -> None:
    """A worker cancelled while it waited for its helper tasks to stop carried on as if
    nothing had happened, and whoever cancelled it waited for it forever."""
    keeper = TaskKeeper()

    stopping = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            stopping.set()
            await asyncio.sleep(0.2)  # slow to stop: the caller is cancelled meanwhile

    keeper.spawn(slow_to_stop(), name="slow")
    await asyncio.sleep(0)
    caller = asyncio.ensure_future(keeper.cancel_and_wait())
    await asyncio.wait_for(stopping.wait(), 10)  # the caller waits for it now
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller


async def test_cancel_and_wait_raises_what_is_not_ignored() -> None:
    keeper = TaskKeeper()

    async def fails_on_stop(error: Exception) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            raise error

    keeper.spawn(fails_on_stop(KeyError("k")), name="a")
    keeper.spawn(fails_on_stop(ValueError("v")), name="b")
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="v"):
        await keeper.cancel_and_wait(KeyError)


async def test_one_task_cancelled_and_waited_for() -> None:
    """``cancel_and_wait(task)``: the task's own cancellation is its end; a failure of an
    ignored type is swallowed, any other raised; a caller cancelled meanwhile is cancelled
    (a lease's owner cancelled while it stopped its keep-alive went on as if not)."""

    stopping = asyncio.Event()

    async def ends_with(error: BaseException | None, pause: float = 0.0) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            stopping.set()
            await asyncio.sleep(pause)  # slow to stop when asked to
            if error is not None:
                raise error

    loop = asyncio.get_running_loop()
    quiet = loop.create_task(ends_with(None))
    await asyncio.sleep(0)
    await cancel_and_wait(quiet)
    assert quiet.cancelled()

    swallowed = loop.create_task(ends_with(KeyError("k")))
    await asyncio.sleep(0)
    await cancel_and_wait(swallowed, KeyError)

    raised = loop.create_task(ends_with(ValueError("v")))
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="v"):
        await cancel_and_wait(raised, KeyError)

    slow = loop.create_task(ends_with(None, pause=0.2))
    await asyncio.sleep(0)
    stopping.clear()
    caller = asyncio.ensure_future(cancel_and_wait(slow))
    await asyncio.wait_for(stopping.wait(), 10)  # the caller waits for it now
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
