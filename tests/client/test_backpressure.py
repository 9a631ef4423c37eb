"""Append backpressure: the client-wide FIFO budget of unfinished adds and
their bytes -- pure state-machine tests first, then through ledger handles on fake bookies."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client import DigestType
from aiobk.client.add import ADD_FRAME_OVERHEAD
from aiobk.client.backpressure import AddBudget, acquire
from aiobk.client.errors import EntryTooLargeError
from aiobk.protocol import DEFAULT_MAX_FRAME_SIZE, AddRequest, Request, master_key
from tests.client.fakes import Rule, is_add
from tests.support.wait import wait_until

# ---------------------------------------------------------------------------- pure budget


def test_admits_in_order_and_never_lets_a_small_one_overtake() -> None:
    budget = AddBudget(max_adds=10, max_bytes=100)
    woken: list[str] = []
    assert budget.admit(60)
    budget.wait(60, lambda: woken.append("big"))  # does not fit beside the first
    budget.wait(10, lambda: woken.append("small"))  # would fit, but queues behind "big"
    assert not budget.admit(10)  # nor may a newcomer barge in
    assert woken == []
    budget.release(1, 60)
    assert woken == ["big", "small"]  # both fit now: 60 + 10, in their order
    assert (budget.adds, budget.bytes, budget.waiting) == (2, 70, 0)


def test_one_release_wakes_only_whom_it_makes_room_for() -> None:
    """The livelock's cause was a thundering herd: every completion woke every waiter. Here a
    release of one add wakes exactly one waiter of 100,000, in O(1)."""
    budget = AddBudget(max_adds=100, max_bytes=1 << 40)
    woken: list[int] = []
    for _ in range(100):
        assert budget.admit(1)
    for i in range(100_000):
        budget.wait(1, lambda i=i: woken.append(i))
    assert woken == []
    for step in range(100_000):
        budget.release(1, 1)
        assert len(woken) == step + 1  # one released add, one admitted waiter
    assert woken == list(range(100_000))
    assert budget.adds == 100


def test_a_request_larger_than_the_byte_limit_goes_alone() -> None:
    budget = AddBudget(max_adds=10, max_bytes=100)
    woken: list[str] = []
    assert budget.admit(10)
    budget.wait(500, lambda: woken.append("huge"))
    budget.wait(10, lambda: woken.append("after"))
    assert woken == []
    budget.release(1, 10)  # nothing else outstanding: the huge one goes, alone
    assert woken == ["huge"]
    assert (budget.adds, budget.bytes) == (1, 500)
    budget.release(1, 500)
    assert woken == ["huge", "after"]
    assert AddBudget(1, 100).admit(10**9)  # and at once when nothing is outstanding


def test_a_cancelled_waiter_at_the_head_unblocks_the_rest() -> None:
    budget = AddBudget(max_adds=10, max_bytes=100)
    woken: list[str] = []
    assert budget.admit(50)
    big = budget.wait(80, lambda: woken.append("big"))  # blocks the line
    budget.wait(20, lambda: woken.append("small"))
    assert woken == []
    budget.cancel(big)  # its appender went away: the small one fits now
    assert woken == ["small"]
    assert (budget.adds, budget.bytes, budget.waiting) == (2, 70, 0)


async def test_admitted_then_cancelled_passes_its_turn_on() -> None:
    budget = AddBudget(max_adds=1, max_bytes=1000)
    assert budget.admit(1)
    second = asyncio.ensure_future(acquire(budget, 2))
    third = asyncio.ensure_future(acquire(budget, 3))
    await wait_until(lambda: budget.waiting == 2, every=0)
    budget.release(1, 1)  # admits the second ...
    second.cancel()  # ... which is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await second
    async with asyncio.timeout(10):
        await third  # its grant went on to the third
    assert (budget.adds, budget.bytes, budget.waiting) == (1, 3, 0)


async def test_cancelled_while_waiting_leaves_no_trace() -> None:
    budget = AddBudget(max_adds=1, max_bytes=1000)
    assert budget.admit(1)
    waiters = [asyncio.ensure_future(acquire(budget, 1)) for _ in range(3)]
    await wait_until(lambda: budget.waiting == 3, every=0)
    waiters[0].cancel()
    waiters[1].cancel()
    await asyncio.gather(*waiters[:2], return_exceptions=True)
    assert budget.waiting == 1
    budget.release(1, 1)
    async with asyncio.timeout(10):
        await waiters[2]
    assert (budget.adds, budget.bytes, budget.waiting) == (1, 1, 0)


def test_releasing_more_than_was_lent_is_a_bug() -> None:
    budget = AddBudget(max_adds=1, max_bytes=10)
    with pytest.raises(RuntimeError):
        budget.release(1, 1)


# ---------------------------------------------------------------------------- through handles


async def test_bytes_bound_is_shared_by_every_handle_of_a_client(world) -> None:
    bookies = await world.bookies(3)
    bk = await world.client(max_outstanding_bytes=10 * 1024)
    handles = [await bk.create_ledger(3, 3, 2) for _ in range(3)]
    gates = [b.hold(is_add(), times=None) for b in bookies]
    payload = b"x" * 1024
    tasks = [asyncio.ensure_future(handles[i % 3].append(payload)) for i in range(60)]
    await wait_until(lambda: bk.add_budget.waiting == 50, every=0)
    await wait_until(lambda: all(g.count == 10 for g in gates), every=0)
    for _ in range(50):
        await asyncio.sleep(0)
    # Ten 1 KiB adds in flight over the three ledgers together, not ten per ledger.
    assert [g.count for g in gates] == [10, 10, 10]
    assert (bk.add_budget.adds, bk.add_budget.bytes) == (10, 10 * 1024)
    for gate in gates:
        gate.release()
    ids = await asyncio.gather(*tasks)
    for index in range(3):
        assert ids[index::3] == list(range(20))  # each ledger's ids dense, in call order
    # The last answers give back the last shares
    await wait_until(lambda: bk.add_budget.adds == 0, every=0)
    assert (bk.add_budget.bytes, bk.add_budget.waiting) == (0, 0)


async def test_admission_is_fifo_across_handles(world) -> None:
    """A large append at the head is not overtaken by a smaller one on another ledger that
    would fit: it queues behind."""
    bookies = await world.bookies(3)
    bk = await world.client(max_outstanding_bytes=1000)
    h1, h2 = await bk.create_ledger(3, 3, 2), await bk.create_ledger(3, 3, 2)
    gates = [b.hold(is_add(), times=None) for b in bookies]
    order: list[bytes] = []

    async def append(handle, data: bytes) -> int:
        _entry_id, confirmed = await handle.submit(data)
        order.append(data[:1])
        return await confirmed

    first = asyncio.ensure_future(append(h1, b"a" * 600))
    await wait_until(lambda: gates[0].count == 1, every=0)
    second = asyncio.ensure_future(append(h1, b"b" * 600))  # does not fit beside the first
    third = asyncio.ensure_future(append(h2, b"c" * 100))  # would fit, must not overtake
    await wait_until(lambda: bk.add_budget.waiting == 2, every=0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert order == [b"a"]
    assert gates[0].count == 1
    for gate in gates:
        gate.release()
    assert await asyncio.gather(first, second, third) == [0, 1, 0]
    assert order == [b"a", b"b", b"c"]


async def test_cancelled_appenders_leak_no_slot_and_block_no_one(world) -> None:
    bookies = await world.bookies(3)
    bk = await world.client(max_outstanding_adds=1)
    lh = await bk.create_ledger(3, 3, 2)
    budget = bk.add_budget
    gates = [b.hold(is_add(), times=None) for b in bookies]
    first = asyncio.ensure_future(lh.append(b"first"))
    await wait_until(lambda: gates[0].count == 1, every=0)
    gone = asyncio.ensure_future(lh.append(b"cancelled while waiting"))
    woken = asyncio.ensure_future(lh.append(b"cancelled once admitted"))
    last = asyncio.ensure_future(lh.append(b"last"))
    await wait_until(lambda: budget.waiting == 3, every=0)
    gone.cancel()
    await wait_until(lambda: budget.waiting == 2, every=0)

    release = budget.release

    def release_then_cancel(adds: int, size: int) -> None:
        release(adds, size)  # admits ``woken`` ...
        if not woken.done():
            woken.cancel()  # ... which is cancelled before it resumes

    budget.release = release_then_cancel  # type: ignore[method-assign]
    for gate in gates:
        gate.release()
    async with asyncio.timeout(10):
        assert await first == 0
        assert await last == 1  # neither cancelled appender took an entry id
    for task in (gone, woken):
        with pytest.raises(asyncio.CancelledError):
            await task
    await wait_until(lambda: budget.adds == 0, every=0)
    assert (budget.bytes, budget.waiting) == (0, 0)
    assert await lh.append(b"more") == 2


async def test_twenty_thousand_queued_appends_do_not_livelock(world) -> None:
    """A livelock in miniature: with the old wake-everyone scheme this many appends queued
    behind a limit of 100 resumed every waiter on every completion (hours of CPU)."""
    await world.bookies(1)
    bk = await world.client(max_outstanding_adds=100)
    lh = await bk.create_ledger(1, 1, 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    ids = await asyncio.gather(*(lh.append(b"%d" % i) for i in range(20_000)))
    assert ids == list(range(20_000))
    assert loop.time() - started < 60


async def test_an_entry_too_large_for_a_frame_fails_at_once(world) -> None:
    await world.bookies(3)
    bk = await world.client(digest_type=DigestType.MAC)  # the largest digest
    lh = await bk.create_ledger(3, 3, 2, password=b"pw")
    limit = DEFAULT_MAX_FRAME_SIZE - ADD_FRAME_OVERHEAD - len(master_key(b"pw"))
    async with asyncio.timeout(30):
        assert await lh.append(b"x" * limit) == 0  # the largest goes through a real codec
        with pytest.raises(EntryTooLargeError, match="does not fit in one add request"):
            await lh.append(b"x" * (limit + 1))
        assert await lh.append(b"next") == 1  # no entry id was taken, the ledger is fine
    await wait_until(lambda: bk.add_budget.adds == 0, every=0)
    assert bk.add_budget.bytes == 0


async def test_an_append_over_the_byte_budget_goes_alone(world) -> None:
    bookies = await world.bookies(3)
    bk = await world.client(max_outstanding_bytes=1000)
    lh = await bk.create_ledger(3, 3, 2)
    outstanding_when_sent: list[int] = []

    def probe(request: Request) -> bool:  # never matches: only looks
        if isinstance(request, AddRequest) and request.entry_id == 1:
            outstanding_when_sent.append(bk.add_budget.adds)
        return False

    bookies[0].rules.append(Rule(probe, "drop"))
    gates = [b.hold(is_add(), times=None) for b in bookies]
    small = asyncio.ensure_future(lh.append(b"s" * 10))
    await wait_until(lambda: gates[0].count == 1, every=0)
    huge = asyncio.ensure_future(lh.append(b"h" * 5000))  # five times the budget
    after = asyncio.ensure_future(lh.append(b"a" * 10))
    await wait_until(lambda: bk.add_budget.waiting == 2, every=0)
    for gate in gates:
        gate.release()
    assert await asyncio.gather(small, huge, after) == [0, 1, 2]
    assert outstanding_when_sent == [1]  # the huge one was the only add outstanding
    await wait_until(lambda: bk.add_budget.adds == 0, every=0)
    assert bk.add_budget.bytes == 0


async def test_a_slow_bookie_holds_the_budget_until_it_answers(world) -> None:
    """With AQ < WQ an entry is acknowledged before the slowest bookie has it, but that bookie's
    connection still holds the frame: its share of the budget stays taken until the bookie
    answers, so a laggard costs the client at most the budget."""
    bookies = await world.bookies(3)
    bk = await world.client(max_outstanding_bytes=4 * 1024)
    lh = await bk.create_ledger(3, 3, 2)
    slow = next(b for b in bookies if b.bookie_id == lh.metadata.ensemble[2])
    gate = slow.hold(is_add(), times=None)
    payload = b"x" * 1024
    assert await asyncio.gather(*(lh.append(payload) for _ in range(4))) == [0, 1, 2, 3]
    assert (bk.add_budget.adds, bk.add_budget.bytes) == (4, 4096)  # acknowledged, not answered
    fifth = asyncio.ensure_future(lh.append(payload))
    await wait_until(lambda: bk.add_budget.waiting == 1, every=0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not fifth.done()
    gate.release()
    assert await fifth == 4
    await wait_until(lambda: bk.add_budget.adds == 0, every=0)
