"""The known protocol traps 1-4 (``ProtocolSwitches``): each scripted exactly on fake bookies, shown
to hold with its fix and to lose data with the fix switched off.

The writers send no explicit LAC: each script decides which LAC the bookies hold, and a timed LAC
update arriving on a slow run would change the script."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client import ProtocolSwitches
from aiobk.client.errors import LedgerFencedError, LedgerRecoveryError
from aiobk.client.quorum import write_set
from aiobk.metadata import LedgerMetadata
from tests.client.fakes import is_add, is_fence_lac, is_read
from tests.support.wait import wait_until

OFF = {
    1: ProtocolSwitches(recovery_reads_fence=False),
    2: ProtocolSwitches(recovery_start_floor=False),
    3: ProtocolSwitches(recovery_changes_local=False),
    4: ProtocolSwitches(recovery_frozen_lac=False),
}


def fix(on: bool, trap: int) -> ProtocolSwitches:
    return ProtocolSwitches() if on else OFF[trap]


def assert_replicated(world, metadata: LedgerMetadata, ledger_id: int) -> None:
    """I3: every entry up to the last is on an ack quorum of its write set."""
    assert metadata.last_entry_id is not None
    for entry in range(metadata.last_entry_id + 1):
        fragment = metadata.fragment_for(entry)
        slots = write_set(entry, metadata.ensemble_size, metadata.write_quorum)
        holders = [
            fragment.ensemble[s]
            for s in slots
            if world.network.bookies[fragment.ensemble[s]].has(ledger_id, entry)
        ]
        assert len(holders) >= metadata.ack_quorum, (entry, holders)


@pytest.mark.parametrize("on", [True, False], ids=["fix-on", "fix-off"])
async def test_trap1_recovery_reads_must_fence(world, on: bool) -> None:
    """The TLA+ counterexample: w1's e0 reaches b2 only; the fence to b3 is lost; recovery
    reads e0 and hears NoSuchEntry from b1 and b3 before b2 answers; then w1's delayed e0
    reaches b3. Without fencing reads, b3 takes it and w1 acknowledges an entry the closed
    ledger does not have."""
    b1, b2, b3 = await world.bookies(3)
    w1 = await world.client(seed=1, explicit_lac_delay=0)
    lh = await w1.create_ledger(3, 3, 2)
    b1.drop(is_add(0))
    late_e0 = b3.hold(is_add(0))
    append = asyncio.ensure_future(lh.append(b"e0"))
    await wait_until(lambda: b2.has(lh.ledger_id, 0), every=0)
    await late_e0.arrived.wait()

    b3.drop(is_fence_lac())  # the fencing read to b3 is lost
    b2_answer = b2.hold(is_read(0))  # b2's positive comes too late to matter
    w2 = await world.client(seed=2, switches=fix(on, 1))
    rh = await w2.open_ledger(lh.ledger_id)
    assert rh.metadata.last_entry_id == -1  # closed as empty: e0 was not acknowledged

    late_e0.release()  # w1's e0 finally reaches b3
    b2_answer.release()
    if on:
        with pytest.raises(LedgerFencedError):
            await asyncio.wait_for(append, 10)
    else:
        assert await asyncio.wait_for(append, 10) == 0, "acknowledged ..."
        assert rh.metadata.last_entry_id < 0  # ... yet truncated: data loss


@pytest.mark.parametrize("on", [True, False], ids=["fix-on", "fix-off"])
async def test_trap2_recovery_starts_at_the_last_fragment(world, on: bool) -> None:
    """A writer changed the ensemble at entry 5 and died before writing there: the new bookies
    answer LAC -1. Starting at entry 0 would write back old entries into the new ensemble and
    a write-back failure there would need a fragment at entry 0 -- an invalid ledger."""
    b1, b2, b3 = await world.bookies(3)
    w1 = await world.client(seed=1, explicit_lac_delay=0)
    lh = await w1.create_ledger(3, 3, 2)
    b4, b5, b6, _spare = await world.bookies(4, first_port=9004)
    for i in range(5):
        await lh.append(b"%d" % i)
    first = tuple(lh.metadata.ensemble)
    moved = lh.metadata.with_fragment(5, (b4.bookie_id, b5.bookie_id, b6.bookie_id))
    await world.store.write_ledger(lh.ledger_id, moved)  # the writer's ensemble change
    assert set(first) == {b1.bookie_id, b2.bookie_id, b3.bookie_id}
    b5.fail(is_add(recovery=True))  # write-backs to b5 and b6 fail: no ack quorum without
    b6.fail(is_add(recovery=True))  # an ensemble change (the TLA+ trace loses one of two)
    w2 = await world.client(seed=2, switches=fix(on, 2))
    if on:
        rh = await w2.open_ledger(lh.ledger_id)
        assert rh.metadata.last_entry_id == 4
        assert [f.first_entry_id for f in rh.metadata.fragments] == [0, 5]
        assert_replicated(world, rh.metadata, lh.ledger_id)
    else:
        with pytest.raises(LedgerRecoveryError, match="write-back failed"):
            await w2.open_ledger(lh.ledger_id)


@pytest.mark.parametrize("on", [True, False], ids=["fix-on", "fix-off"])
async def test_trap3_recovery_ensemble_changes_stay_local(world, on: bool) -> None:
    """w1 acknowledged e1 on {b2, b3}. Recovery r1 writes e1 back, b3 fails it, r1 replaces b3
    by b4 -- and dies before closing. If that change reached the metadata, recovery r2 asks
    {b1, b2, b4} and can hear NoSuchEntry from b1 and b4 first: e1 is truncated."""
    b1, b2, b3 = await world.bookies(3)
    w1 = await world.client(seed=1, explicit_lac_delay=0)
    lh = await w1.create_ledger(3, 3, 2)
    (b4,) = await world.bookies(1, first_port=9004)
    await lh.append(b"e0")
    b1.drop(is_add(1))
    e1 = asyncio.ensure_future(lh.append(b"e1"))
    assert await asyncio.wait_for(e1, 10) == 1  # acknowledged on b2 and b3

    # r1: b1 never gets its write-back, b3 fails it, b4's is held; then r1 dies.
    b1.drop(is_add(1, recovery=True))
    b3.fail(is_add(1, recovery=True))
    stuck = b4.hold(is_add(1, recovery=True))
    r1 = await world.client(seed=3, switches=fix(on, 3))
    recovery = asyncio.ensure_future(r1.open_ledger(lh.ledger_id))
    await stuck.arrived.wait()
    recovery.cancel()  # r1 crashes mid-recovery
    with pytest.raises(asyncio.CancelledError):
        await recovery

    # r2: b2's answer to the read of e1 comes last.
    b2.hold(is_read(1))
    r2 = await world.client(seed=4)
    rh = await asyncio.wait_for(r2.open_ledger(lh.ledger_id), 10)
    if on:
        assert rh.metadata.last_entry_id == 1
        assert_replicated(world, rh.metadata, lh.ledger_id)
    else:
        assert rh.metadata.last_entry_id == 0  # acknowledged e1 truncated: data loss


@pytest.mark.parametrize("on", [True, False], ids=["fix-on", "fix-off"])
async def test_trap4_write_backs_carry_the_frozen_lac(world, on: bool) -> None:
    """r1 recovers e2 (on b1 only) onto {b1, b4} after b3 fails, then writes back e3 with a LAC
    that -- unfrozen -- says 2, and dies. r2's fencing reads then start after e2, closing the
    ledger with e2 on a single bookie of its write set."""
    b1, b2, b3 = await world.bookies(3)
    w1 = await world.client(seed=1, explicit_lac_delay=0)
    lh = await w1.create_ledger(3, 3, 2)
    (b4,) = await world.bookies(1, first_port=9004)
    await lh.append(b"e0")
    b3.drop(is_add(recovery=False))  # b3 gets nothing more from w1
    await lh.append(b"e1")  # on b1, b2
    b2.drop(is_add(2, recovery=False))
    b2.drop(is_add(3, recovery=False))
    pending = [asyncio.ensure_future(lh.append(b"e%d" % i)) for i in (2, 3)]  # b1 only
    await wait_until(lambda: b1.has(lh.ledger_id, 3), every=0)

    b2.drop(is_add(recovery=True))  # write-backs never reach b2
    b3.fail(is_add(recovery=True))  # ... and fail at b3 (so b3 gets replaced by b4)
    for silent in (b2, b3):  # only b1 answers reads of e2 and e3, whoever recovers
        silent.hold(is_read(2, fence=True), times=None)
        silent.hold(is_read(3, fence=True), times=None)
    e3_read = b1.hold(is_read(3))  # r1 decides e3 only after e2's write-back completed
    e3_on_b4 = b4.hold(is_add(3, recovery=True))
    r1 = await world.client(seed=3, switches=fix(on, 4))
    recovery = asyncio.ensure_future(r1.open_ledger(lh.ledger_id))
    await e3_read.arrived.wait()
    await wait_until(lambda: b4.has(lh.ledger_id, 2), every=0)
    e3_read.release()
    await e3_on_b4.arrived.wait()
    await wait_until(lambda: any(is_add(3, recovery=True)(r) for r in b1.processed), every=0)
    recovery.cancel()  # r1 dies before closing
    with pytest.raises(asyncio.CancelledError):
        await recovery
    for task in pending:
        task.cancel()

    r2 = await world.client(seed=4)
    rh = await asyncio.wait_for(r2.open_ledger(lh.ledger_id), 10)
    assert rh.metadata.last_entry_id == 3
    if on:
        assert_replicated(world, rh.metadata, lh.ledger_id)
    else:
        with pytest.raises(AssertionError):
            assert_replicated(world, rh.metadata, lh.ledger_id)  # e2 on one bookie only
