"""Scenario families -- fencing, recovery, ensemble changes, long polls, digests, volatile
ledgers -- each an exact interleaving on fake bookies (no sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client import BookieConnection, Durability, ProtocolSwitches
from aiobk.client.errors import (
    BookieUnavailableError,
    LedgerFencedError,
    LedgerRecoveryError,
    NotEnoughBookiesError,
)
from aiobk.metadata import LedgerState, MemoryKV
from aiobk.protocol import AddRequest, ForceRequest, StatusCode
from tests.client.fakes import Gate, any_request, is_add, is_read
from tests.client.test_traps import assert_replicated
from tests.support.wait import wait_until


def hold_ledger_cas(world, ledger_key: bytes, skip: int = 0) -> Gate:
    """Hold a compare-and-set of one ledger's metadata in the memory store (the next one, or
    the one after ``skip`` others)."""
    gate = Gate()
    kv = world.store.kv
    assert isinstance(kv, MemoryKV)
    seen = 0

    async def hook(op: str, key: bytes) -> None:
        nonlocal seen
        if op != "compare_and_set" or key != ledger_key:
            return
        seen += 1
        if seen == skip + 1:
            gate.count += 1
            gate.arrived.set()
            await gate._open.wait()

    kv.hook = hook
    return gate


# ---------------------------------------------------------------------------- fencing


async def test_fencing_basic_writer_gets_fenced(world) -> None:
    await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    await lh.append(b"a")
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    assert rh.metadata.last_entry_id == 0
    with pytest.raises(LedgerFencedError):
        await lh.append(b"b")
    await lh.close()  # CLOSED at the writer's own last entry -> close succeeds
    assert lh.metadata.last_entry_id == 0


async def test_fencing_with_one_bookie_silent(world) -> None:
    _b1, _b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    for i in range(3):
        await lh.append(b"%d" % i)
    b3.drop(any_request())  # b3 hears nothing, says nothing
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    assert rh.metadata.last_entry_id == 2


async def test_fence_reaches_a_bookie_that_never_saw_the_ledger(world) -> None:
    _b1, _b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    b3.drop(is_add())  # b3 never sees the ledger from the writer
    await lh.append(b"a")
    assert lh.ledger_id not in b3.ledgers
    reader = await world.client(seed=2)
    await reader.open_ledger(lh.ledger_id)
    assert b3.ledgers[lh.ledger_id].fenced  # created fenced by the fence itself
    b3.rules.clear()
    with pytest.raises(LedgerFencedError):
        await lh.append(b"b")


async def test_open_without_recovery_never_fences(world) -> None:
    bookies = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    for i in range(3):
        await lh.append(b"%d" % i)
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id, recovery=False)
    assert not rh.is_closed
    assert rh.metadata.state is LedgerState.OPEN
    assert rh.last_add_confirmed == 1  # the piggybacked LAC: entry 2's ack is not known yet
    assert not any(led.fenced for b in bookies for led in b.ledgers.values())
    assert await lh.append(b"3") == 3
    await lh.append(b"4")
    assert await rh.read_last_add_confirmed() == 3
    assert [e.data for e in await rh.read(0, 3)] == [b"0", b"1", b"2", b"3"]


# ---------------------------------------------------------------------------- recovery


async def test_recovery_writes_back_an_entry_found_on_a_single_bookie(world) -> None:
    b1, b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    await lh.append(b"e0")
    b2.drop(is_add(1, recovery=False))
    b3.drop(is_add(1, recovery=False))
    asyncio.ensure_future(lh.append(b"e1")).add_done_callback(lambda f: f.exception())
    await wait_until(lambda: b1.has(lh.ledger_id, 1), every=0)
    for silent in (b2, b3):
        silent.hold(is_read(1, fence=True))  # their NoSuchEntry would end the ledger at 0
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    assert rh.metadata.last_entry_id == 1  # the single positive was written back ...
    assert_replicated(world, rh.metadata, lh.ledger_id)  # ... to an ack quorum, before close


@pytest.mark.parametrize(
    ("answers", "closes"),
    [(("negative", "negative", "silent"), True), (("negative", "silent", "silent"), False)],
)
async def test_negative_quorum_closes_but_too_few_answers_do_not(world, answers, closes) -> None:
    bookies = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    await lh.append(b"e0")
    by_id = {b.bookie_id: b for b in bookies}
    ensemble = [by_id[bid] for bid in lh.metadata.ensemble]
    order = [ensemble[s] for s in (1, 2, 0)]  # write set of entry 1
    for bookie, answer in zip(order, answers, strict=True):
        if answer == "silent":
            bookie.fail(is_read(1, fence=True), StatusCode.EIO)
    reader = await world.client(seed=2)
    if closes:
        rh = await reader.open_ledger(lh.ledger_id)
        assert rh.metadata.last_entry_id == 0
    else:
        with pytest.raises(LedgerRecoveryError, match="cannot tell"):
            await reader.open_ledger(lh.ledger_id)
        assert (await world.store.read_ledger(lh.ledger_id)).state is LedgerState.IN_RECOVERY


async def test_an_entry_gap_ends_the_ledger(world) -> None:
    b1, b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    for i in range(3):
        await lh.append(b"%d" % i)
    for bookie in (b1, b2, b3):
        bookie.drop(is_add(3))  # entry 3 reaches nobody; entry 4 reaches everybody
    pending = [asyncio.ensure_future(lh.append(b"%d" % i)) for i in (3, 4)]
    await wait_until(lambda: b1.has(lh.ledger_id, 4), every=0)
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    assert rh.metadata.last_entry_id == 2  # 4 exists but follows a hole: never acknowledged
    for task in pending:
        task.cancel()


async def test_two_recovering_clients_end_in_one_closed_state(world) -> None:
    await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    for i in range(20):
        await lh.append(b"%d" % i)
    first, second = await world.client(seed=2), await world.client(seed=3)
    a, b = await asyncio.gather(first.open_ledger(lh.ledger_id), second.open_ledger(lh.ledger_id))
    assert a.metadata == b.metadata
    assert a.metadata.last_entry_id == 19
    assert a.metadata.version == b.metadata.version


async def test_writer_close_racing_recovery(world) -> None:
    await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    for i in range(5):
        await lh.append(b"%d" % i)
    key = world.store.keys.ledger(lh.ledger_id)
    gate = hold_ledger_cas(world, key)  # the writer's close CAS is held ...
    closing = asyncio.ensure_future(lh.close())
    await gate.arrived.wait()
    reader = await world.client(seed=2)
    world.store.kv.hook = None
    recovering = asyncio.ensure_future(reader.open_ledger(lh.ledger_id))
    await wait_until(recovering.done, every=0)  # ... while recovery marks, fences and closes
    gate.release()
    await closing  # lost the CAS, re-read: CLOSED at its own last entry -> success
    rh = recovering.result()
    assert rh.metadata.last_entry_id == 4 == lh.metadata.last_entry_id  # one agreed end


async def test_everything_down_then_back(world) -> None:
    bookies = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    for i in range(3):
        await lh.append(b"%d" % i)
    for bookie in bookies:
        bookie.crash()
    reader = await world.client(seed=2, reconnect_backoff_min=0.001, reconnect_backoff_max=0.001)
    with pytest.raises(LedgerRecoveryError, match="fence"):
        await reader.open_ledger(lh.ledger_id)
    for bookie in bookies:
        bookie.revive()
    await asyncio.sleep(0.01)  # let the client's reconnect backoff pass
    rh = await reader.open_ledger(lh.ledger_id)
    assert rh.metadata.last_entry_id == 2


async def test_write_back_failure_changes_the_ensemble_at_close(world) -> None:
    _b1, b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    (b4,) = await world.bookies(1, first_port=9004)
    await lh.append(b"e0")
    b3.drop(is_add(1, recovery=False))
    await lh.append(b"e1")  # on b1, b2
    b2.drop(is_add(recovery=True))  # only b1 acks the write-back: no ack quorum ...
    b3.fail(is_add(recovery=True))  # ... without replacing b3
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    assert rh.metadata.last_entry_id == 1
    assert [f.first_entry_id for f in rh.metadata.fragments] == [0, 1]
    assert b4.bookie_id in rh.metadata.fragments[1].ensemble
    assert_replicated(world, rh.metadata, lh.ledger_id)


# ---------------------------------------------------------------------------- ensemble change


async def test_ensemble_change_replaces_at_lac_plus_one(world) -> None:
    b1, b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    (b4,) = await world.bookies(1, first_port=9004)
    for i in range(5):
        await lh.append(b"%d" % i)
    failing = next(b for b in (b1, b2, b3) if b.bookie_id == lh.metadata.ensemble[0])
    failing.fail(is_add())
    ids = await asyncio.gather(*(lh.append(b"%d" % i) for i in range(5, 10)))
    assert ids == list(range(5, 10))
    fragments = lh.metadata.fragments
    assert [f.first_entry_id for f in fragments] == [0, 5]
    assert b4.bookie_id in fragments[1].ensemble
    assert failing.bookie_id not in fragments[1].ensemble
    await lh.close()
    rh = await (await world.client(seed=2)).open_ledger(lh.ledger_id)
    assert [e.data for e in await rh.read(0, 9)] == [b"%d" % i for i in range(10)]
    assert_replicated(world, rh.metadata, lh.ledger_id)


@pytest.mark.parametrize("hold", [True, False], ids=["fix-on", "fix-off"])
async def test_acks_are_held_until_the_change_lands(world, hold: bool) -> None:
    b1, b2, b3 = await world.bookies(3)
    switches = ProtocolSwitches(hold_acks_during_change=hold)
    writer = await world.client(seed=1, switches=switches)
    lh = await writer.create_ledger(3, 3, 2)
    await world.bookies(1, first_port=9004)
    await lh.append(b"e0")
    failing = next(b for b in (b1, b2, b3) if b.bookie_id == lh.metadata.ensemble[2])
    failing.fail(is_add(1))
    gate = hold_ledger_cas(world, world.store.keys.ledger(lh.ledger_id))
    append = asyncio.ensure_future(lh.append(b"e1"))
    await gate.arrived.wait()  # e1 has its ack quorum from the other two; the CAS is held
    for _ in range(50):
        await asyncio.sleep(0)
    assert append.done() is not hold  # held while the new fragment is not in the metadata
    gate.release()
    assert await asyncio.wait_for(append, 10) == 1


@pytest.mark.parametrize("hold", [True, False], ids=["fix-on", "fix-off"])
async def test_early_replacement_ack_is_held_until_the_change_lands(world, hold: bool) -> None:
    """The trap the hold exists for: the writer sends to the replacement before its CAS
    (``replace_after_cas`` off), the replacement and one old bookie ack e1, and a recovery
    moves the ledger to IN_RECOVERY before the CAS. Recovery reads the old ensemble, finds e1
    on one bookie and absent on two (QC), and closes at e0. Held, e1 was never acknowledged;
    not held, the writer acknowledged an entry the closed ledger does not contain (I1)."""
    b1, b2, b3 = await world.bookies(3)
    switches = ProtocolSwitches(hold_acks_during_change=hold, replace_after_cas=False)
    writer = await world.client(seed=1, switches=switches)
    lh = await writer.create_ledger(3, 3, 2)
    (b4,) = await world.bookies(1, first_port=9004)
    await lh.append(b"e0")
    by_slot = {bid: i for i, bid in enumerate(lh.metadata.ensemble)}
    slow = next(b for b in (b1, b2, b3) if by_slot[b.bookie_id] == 1)
    failing = next(b for b in (b1, b2, b3) if by_slot[b.bookie_id] == 2)
    slow.hold(is_add(1))  # never answers in this test
    failing.fail(is_add(1))
    gate = hold_ledger_cas(world, world.store.keys.ledger(lh.ledger_id))
    append = asyncio.ensure_future(lh.append(b"e1"))
    await gate.arrived.wait()
    # The replacement has it before the CAS
    await wait_until(lambda: b4.has(lh.ledger_id, 1), every=0)
    for _ in range(50):
        await asyncio.sleep(0)
    assert append.done() is not hold
    world.store.kv.hook = None
    await world.store.update_ledger(lh.ledger_id, lambda md: md.in_recovery())
    recoverer = await world.client(seed=2, read_timeout=1.0)
    rh = await recoverer.open_ledger(lh.ledger_id)  # fences b1 (and the slow one's reads)
    assert rh.metadata.last_entry_id == 0  # e1: on one of three, absent on two
    gate.release()
    (outcome,) = await asyncio.gather(asyncio.wait_for(append, 10), return_exceptions=True)
    if hold:
        assert isinstance(outcome, LedgerFencedError)  # never acknowledged: nothing lost
    else:
        assert outcome == 1  # acknowledged, yet the ledger ended at 0: the loss the rule stops


async def test_ensemble_change_losing_to_recovery_stops_the_writer(world) -> None:
    b1, b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    await world.bookies(1, first_port=9004)
    await lh.append(b"e0")
    failing = next(b for b in (b1, b2, b3) if b.bookie_id == lh.metadata.ensemble[0])
    failing.fail(is_add(1))
    key = world.store.keys.ledger(lh.ledger_id)
    gate = hold_ledger_cas(world, key)
    append = asyncio.ensure_future(lh.append(b"e1"))
    await gate.arrived.wait()
    world.store.kv.hook = None
    await world.store.update_ledger(lh.ledger_id, lambda md: md.in_recovery())
    version = (await world.store.read_ledger(lh.ledger_id)).version
    gate.release()
    (first,) = await asyncio.gather(asyncio.wait_for(append, 10), return_exceptions=True)
    assert first == 1 or isinstance(first, LedgerFencedError)  # e1 may have had its quorum
    with pytest.raises(LedgerFencedError):
        await lh.append(b"e2")
    with pytest.raises(LedgerFencedError):
        await lh.close()
    with pytest.raises(LedgerFencedError):  # the ledger is not closed: saying so twice is true
        await lh.close()
    assert (await world.store.read_ledger(lh.ledger_id)).version == version  # untouched


async def test_a_second_failure_during_a_change(world) -> None:
    b1, b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    b4, b5 = await world.bookies(2, first_port=9004)
    await lh.append(b"e0")
    by_slot = {bid: i for i, bid in enumerate(lh.metadata.ensemble)}
    first = next(b for b in (b1, b2, b3) if by_slot[b.bookie_id] == 1)
    second = next(b for b in (b1, b2, b3) if by_slot[b.bookie_id] == 2)
    first.fail(is_add())
    gate = hold_ledger_cas(world, world.store.keys.ledger(lh.ledger_id))
    append = asyncio.ensure_future(lh.append(b"e1"))
    await gate.arrived.wait()
    second.fail(is_add())  # fails while the first change's CAS is in flight
    later = asyncio.ensure_future(lh.append(b"e2"))
    await asyncio.sleep(0)
    world.store.kv.hook = None
    gate.release()
    assert await asyncio.wait_for(append, 10) == 1
    assert await asyncio.wait_for(later, 10) == 2
    final = lh.metadata.ensemble
    assert first.bookie_id not in final
    assert second.bookie_id not in final
    assert {b4.bookie_id, b5.bookie_id} <= set(final)
    await lh.close()
    rh = await (await world.client(seed=2)).open_ledger(lh.ledger_id)
    assert [e.data for e in await rh.read(0, 2)] == [b"e0", b"e1", b"e2"]
    assert_replicated(world, rh.metadata, lh.ledger_id)


async def test_striped_ledger_survives_a_failure(world) -> None:
    bookies = await world.bookies(5)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(5, 3, 2)
    (spare,) = await world.bookies(1, first_port=9006)
    await asyncio.gather(*(lh.append(b"%d" % i) for i in range(10)))
    bookies[0].fail(is_add())
    await asyncio.gather(*(lh.append(b"%d" % i) for i in range(10, 30)))
    assert spare.bookie_id in lh.metadata.ensemble
    await lh.close()
    rh = await (await world.client(seed=2)).open_ledger(lh.ledger_id)
    assert [e.data for e in await rh.read(0, 29)] == [b"%d" % i for i in range(30)]
    assert_replicated(world, rh.metadata, lh.ledger_id)


async def test_no_replacement_fails_the_adds_clearly(world) -> None:
    b1, b2, b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    await lh.append(b"e0")
    failing, slow = (
        next(b for b in (b1, b2, b3) if b.bookie_id == lh.metadata.ensemble[i]) for i in (0, 1)
    )
    failing.fail(is_add())
    held = slow.hold(is_add(1))  # e1 must not reach its ack quorum before the failure
    append = asyncio.ensure_future(lh.append(b"e1"))
    await held.arrived.wait()
    await wait_until(lambda: lh.error is not None, every=0)
    held.release()
    with pytest.raises(NotEnoughBookiesError):
        await append
    await lh.close()  # the ledger still closes at what was acknowledged
    assert lh.metadata.last_entry_id == 0


# ---------------------------------------------------------------------------- long poll


async def test_long_poll_keeps_waiting_on_a_fenced_ledger_until_it_closes(world) -> None:
    _b1, _b2, _b3 = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    await lh.append(b"e0")
    await lh.append(b"e1")
    tail = await world.client(seed=2, long_poll_timeout=0.05)
    rh = await tail.open_ledger(lh.ledger_id, recovery=False)
    assert rh.last_add_confirmed == 0
    gate = hold_ledger_cas(world, world.store.keys.ledger(lh.ledger_id), skip=1)  # the close
    recovering = asyncio.ensure_future((await world.client(seed=3)).open_ledger(lh.ledger_id))
    await gate.arrived.wait()  # recovered, fenced, close held: the bookies' LAC stays at 0 ...
    world.store.kv.hook = None
    assert await rh.wait_for_lac(1, timeout=0.2) == 1  # ... a long poll past it times out
    waiting = asyncio.ensure_future(rh.wait_for_lac(1, timeout=30))
    gate.release()  # recovery closes the ledger at 1
    await recovering
    assert await asyncio.wait_for(waiting, 10) == 1
    assert rh.is_closed


# ---------------------------------------------------------------------------- digests


async def test_a_damaged_copy_is_skipped_and_all_damaged_is_a_digest_error(world) -> None:
    from aiobk.client.errors import DigestMismatchError

    bookies = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    for i in range(3):
        await lh.append(b"entry %d" % i)
    await lh.close()

    def damage(bookie, entry: int) -> None:
        body = bytearray(bookie.ledgers[lh.ledger_id].entries[entry])
        body[-1] ^= 0xFF
        bookie.ledgers[lh.ledger_id].entries[entry] = bytes(body)

    by_id = {b.bookie_id: b for b in bookies}
    first_asked = by_id[lh.metadata.ensemble[1 % 3]]  # entry 1's write set starts at slot 1
    damage(first_asked, 1)
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    assert [e.data for e in await rh.read(1, 1)] == [b"entry 1"]  # the next bookie's copy
    for bookie in bookies:
        damage(bookie, 2)
    with pytest.raises(DigestMismatchError):
        await rh.read(2, 2)


async def test_a_force_does_not_overtake_adds_waiting_for_a_connection(world) -> None:
    """Adds to a bookie whose connection is still being made wait for it, in order. A FORCE
    issued just as the connection appears, before those adds have been handed to it, must
    still reach the bookie after them. It used to slip in between: the bookie answered
    ENOLEDGER, force() failed, and close() -- which forces first -- closed a volatile log
    ledger at -1 under sixty acknowledged records."""
    await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
    slow_id = lh.metadata.ensemble[2]
    slow = world.network.bookies[slow_id]
    world.network.connect_gates[slow_id] = connecting = Gate()
    # Widen the window between "the connection exists" and "the waiting adds resume": the
    # callers that asked for the connection while it was being made are held a while longer.
    pool, handed_over = writer.pool, Gate()
    get = pool.get

    async def get_late_for_early_callers(bookie_id: str, patience: float = 0.0) -> BookieConnection:
        early = bookie_id == slow_id and pool.get_nowait(bookie_id) is None
        conn = await get(bookie_id, patience)
        if early:
            await handed_over._open.wait()
        return conn

    pool.get = get_late_for_early_callers  # type: ignore[method-assign]
    for i in range(5):
        assert await lh.append(b"e%d" % i) == i  # the other two answer; the slow one waits
    connecting.release()
    await wait_until(lambda: pool.get_nowait(slow_id) is not None, every=0)
    force = asyncio.ensure_future(lh.force())
    for _ in range(20):
        await asyncio.sleep(0)
    handed_over.release()
    assert await asyncio.wait_for(force, 10) == 4
    kinds = [type(r).__name__ for r in slow.processed if isinstance(r, AddRequest | ForceRequest)]
    assert kinds == ["AddRequest"] * 5 + ["ForceRequest"], kinds
    await lh.close()
    assert lh.metadata.last_entry_id == 4


async def test_a_force_missing_one_bookie_still_counts_the_others(world) -> None:
    """force() fails while a bookie of the ensemble is unreachable, but the answers of the
    others still move the LAC by BP-14's rule, and close() (which forces first) keeps what
    they synced instead of closing at the old LAC."""
    await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
    for i in range(5):
        await lh.append(b"e%d" % i)
    assert lh.last_add_confirmed < 4
    world.network.bookies[lh.metadata.ensemble[1]].crash()
    with pytest.raises(BookieUnavailableError):
        await lh.force()
    assert lh.last_add_confirmed == 4  # two of three synced 0..4: AQ=2 copies are durable
    await lh.close()
    assert lh.metadata.last_entry_id == 4


@pytest.mark.parametrize("spare", [True, False], ids=["spare", "no-spare"])
async def test_closing_a_volatile_ledger_keeps_acknowledged_entries_a_force_cannot_cover(
    world, spare: bool
) -> None:
    """Entry 4 is acknowledged by A and C (AQ=2 written) while B has not stored it yet; then C
    goes away. force() can only get A (4) and B (3): the LAC is 3. Closing there would drop an
    acknowledged entry, so close() recovers instead -- it finds entry 4 on A, writes it back
    and closes at 4 (BP-14 close-to-open). Without a spare for C, the close either completes
    once the write-back has its ack quorum on A and B, or fails when C's failure comes first:
    an error or a close at 4, never a silent truncation."""
    await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
    _a, b, c = (world.network.bookies[bookie_id] for bookie_id in lh.metadata.ensemble)
    if spare:
        await world.bookies(1, first_port=9004)  # recovery's write-back replaces C with it
    for i in range(4):
        await lh.append(b"e%d" % i)
    late = b.hold(is_add(4))
    assert await lh.append(b"e4") == 4  # A and C
    c.crash()
    if not spare:
        # The write-back of 4 reaches A and B (AQ) or the failed send to C, which cannot be
        # replaced, fails the recovery first: either way, never a close short of 4.
        try:
            await asyncio.wait_for(lh.close(), 10)
        except LedgerRecoveryError:
            stored = await world.store.read_ledger(lh.ledger_id)
            assert not stored.is_closed  # left for a later recovery, not closed short
        else:
            assert lh.metadata.last_entry_id == 4
            assert b.has(lh.ledger_id, 4)  # written back: on A and B, an ack quorum
        late.release()
        return
    await asyncio.wait_for(lh.close(), 10)
    assert lh.metadata.is_closed
    assert lh.metadata.last_entry_id == 4
    assert b.has(lh.ledger_id, 4)  # written back by the recovery
    late.release()
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    assert [e.data for e in await rh.read(0, 4)] == [b"e%d" % i for i in range(5)]
