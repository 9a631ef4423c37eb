"""Draining a bookie for good (``aiobk.autorecovery.decommission``), without the command line:
real bookies in process on a real etcd, their own autorecovery doing the copying."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery.decommission import (
    DecommissionError,
    Progress,
    ask_bookie_state,
    cancel,
    decommission,
    stuck_fragments,
)
from aiobk.client import BookKeeper, ClientConfig
from aiobk.metadata import (
    READ_ONLY,
    BookieServiceInfo,
    Cookie,
    EtcdProcess,
    Fragment,
    LedgerMetadata,
    open_store,
)
from aiobk.protocol import StateChange
from aiobk.protocol.errors import BKError
from tests.autorecovery.helpers import assert_copies, ledgers_naming
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until

# The auditor would not call a stopped bookie lost within a test: what moves is the
# decommission's doing. Registrations last 10 s: with 1 s, a loaded machine let a bookie's
# lapse for a moment, and a worker that looked then took it for lost and moved its copies (a
# make test failure of the cancel test). A stopped bookie's registration goes at once anyway.
SETTINGS = {
    "registration_ttl": 10.0,
    "lost_bookie_recovery_delay": 60.0,
    "autorecovery_lease_ttl": 2.0,
    "autorecovery_poll_interval": 0.2,
    "rereplication_retry_delay": 0.2,
    "open_ledger_rereplication_grace_period": 1.0,
}


def _metadata(*ensembles: tuple[str, ...]) -> LedgerMetadata:
    fragments = tuple(Fragment(10 * i, ensemble) for i, ensemble in enumerate(ensembles))
    return LedgerMetadata(
        ensemble_size=len(ensembles[0]),
        write_quorum=len(ensembles[0]),
        ack_quorum=1,
        fragments=fragments,
    )


def test_a_fragment_is_stuck_when_every_writable_bookie_is_in_its_ensemble() -> None:
    metadata = _metadata(("a", "b", "c"), ("a", "d", "e"))
    assert stuck_fragments(metadata, "a", ["b", "c", "d", "e"]) == []
    assert stuck_fragments(metadata, "a", ["b", "c"]) == [(0, ("a", "b", "c"))]
    assert stuck_fragments(metadata, "a", []) == [(0, ("a", "b", "c")), (10, ("a", "d", "e"))]
    assert stuck_fragments(metadata, "b", ["c"]) == [(0, ("a", "b", "c"))]
    assert stuck_fragments(metadata, "z", []) == []  # named nowhere: nothing to move


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("decommission"))
    cluster = await start_cluster(tmp_path, 4, uri=uri, **SETTINGS)
    yield cluster
    await cluster.stop()


@pytest.fixture
async def bk(cluster: Cluster) -> AsyncIterator[BookKeeper]:
    async with BookKeeper(cluster.uri, ClientConfig(read_timeout=2.0, add_timeout=2.0)) as bk:
        yield bk


async def _closed(bk: BookKeeper, entries: int = 20, **shape: int) -> int:
    lh = await bk.create_ledger(
        shape.get("ensemble_size", 3), shape.get("write_quorum", 3), shape.get("ack_quorum", 2)
    )
    for i in range(entries):
        await lh.append(b"entry %d" % i)
    await lh.close()
    return lh.ledger_id


@pytest.mark.timeout(60)
async def test_a_live_bookie_is_drained_read_only_then_removed_once_stopped(
    cluster: Cluster, bk: BookKeeper
) -> None:
    store = bk.store
    writer = await BookKeeper.connect(cluster.uri, ClientConfig(explicit_lac_delay=0))
    idle = await writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    for i in range(10):
        await idle.append(b"open %d" % i)  # left open: its writer went quiet
    victim_id = idle.metadata.fragments[0].ensemble[0]
    ids = [await _closed(bk) for _ in range(3)] + [idle.ledger_id]
    named = await ledgers_naming(store, victim_id)
    assert idle.ledger_id in named
    seen: list[Progress] = []
    drained = asyncio.Event()

    def notify(progress: Progress) -> None:
        seen.append(progress)
        if progress.stage == "stopping":
            drained.set()

    task = asyncio.create_task(
        decommission(
            store,
            victim_id,
            timeout=30,
            wall_clock=time.time,
            notify=notify,
            poll_interval=0.2,
        )
    )
    async with asyncio.timeout(40):
        await asyncio.wait(
            {task, asyncio.create_task(drained.wait())}, return_when=asyncio.FIRST_COMPLETED
        )
    assert not task.done(), task.result()
    # Drained, still running and registered read-only; the command waits for it to stop.
    assert await ledgers_naming(store, victim_id) == []
    (info,) = [b for b in await store.list_bookies() if b.bookie_id == victim_id]
    assert info.state == READ_ONLY
    assert any(p.note and "set read-only" in p.note for p in seen)
    assert any(p.note and "Stop the bookie" in p.note for p in seen)
    assert await store.read_cookie(victim_id) is not None
    assert victim_id in await store.autorecovery.decommissioning()
    victim = cluster.by_id(victim_id)
    cluster.bookies.remove(victim)
    await victim.stop()
    result = await asyncio.wait_for(task, 20)
    assert (result.bookie_id, result.was_registered, result.cookie_removed) == (
        victim_id, True, True,
    )  # fmt: skip
    assert result.ledgers == len(named)
    assert result.lost == ()
    assert await store.read_cookie(victim_id) is None
    assert await store.autorecovery.decommissioning() == set()
    assert [m async for m in store.autorecovery.marks()] == []
    assert seen[-1].remaining == 0
    for ledger_id in ids:
        await assert_copies(bk, ledger_id)
    # The idle writer's ledger was closed by a worker after its grace period (or the writer
    # moved off the read-only bookie by itself): either way its entries are all there.
    with contextlib.suppress(BKError):
        await idle.close()
    await writer.close()


@pytest.mark.timeout(60)
async def test_what_cannot_end_well_is_refused_before_anything_changes(
    cluster: Cluster, bk: BookKeeper, etcd_server: EtcdProcess
) -> None:
    store, recovery = bk.store, bk.store.autorecovery
    with pytest.raises(DecommissionError, match=r"^unknown bookie 'nobody:1': not registered"):
        await decommission(store, "nobody:1", timeout=5, wall_clock=lambda: 0.0)
    # An ensemble of every bookie: none is left to take a bookie's copies.
    wide = await _closed(bk, 5, ensemble_size=4, write_quorum=3)
    victim_id = (await store.read_ledger(wide)).fragments[0].ensemble[1]
    with pytest.raises(DecommissionError, match=rf"^cannot drain {victim_id}: 1 ledger\(s\)"):
        await decommission(store, victim_id, timeout=5, wall_clock=lambda: 0.0)
    await bk.delete_ledger(wide)
    narrow = await _closed(bk, 5)
    victim_id = (await store.read_ledger(narrow)).fragments[0].ensemble[0]
    await recovery.set_enabled(False)
    with pytest.raises(DecommissionError, match=r"^autorecovery is disabled"):
        await decommission(store, victim_id, timeout=5, wall_clock=lambda: 0.0)
    assert await recovery.decommissioning() == set()
    assert [m async for m in recovery.marks()] == []
    assert all(b.writable for b in await store.list_bookies())
    # A cluster where no autorecovery runs: a dead bookie holding a ledger, one registered.
    async with open_store(etcd_server.uri(unique_name("noauditor"))) as bare:
        await bare.write_cookie(Cookie("ghost:1", "127.0.0.1:1", (), ("/d",), "i"))
        await bare.create_ledger(await bare.allocate_ledger_id(), _metadata(("ghost:1",)))
        other = await bare.register_bookie(BookieServiceInfo("other:1", "127.0.0.1:2"))
        try:
            with pytest.raises(DecommissionError, match=r"^no autorecovery process is running"):
                await decommission(
                    bare, "ghost:1", timeout=5, wall_clock=lambda: 0.0, auditor_wait=0.3
                )
        finally:
            await other.close()
        assert await bare.autorecovery.decommissioning() == set()
        # Once no ledger names it, no worker is needed: its cookie simply goes.
        async for ledger_id in bare.list_ledgers():
            await bare.delete_ledger(ledger_id)
        result = await decommission(bare, "ghost:1", timeout=5, wall_clock=lambda: 0.0)
        assert (result.ledgers, result.was_registered, result.cookie_removed) == (0, False, True)
        assert await bare.read_cookie("ghost:1") is None


@pytest.mark.timeout(60)
async def test_disabled_midway_it_stops_and_cancel_puts_the_bookie_back(
    cluster: Cluster, bk: BookKeeper
) -> None:
    store, recovery = bk.store, bk.store.autorecovery
    ids = [await _closed(bk, 5) for _ in range(3)]
    victim_id = (await store.read_ledger(ids[0])).fragments[0].ensemble[0]
    named = await ledgers_naming(store, victim_id)
    asked: list[StateChange] = []

    async def set_state(address: str, change: StateChange) -> None:
        # Autorecovery is switched off just before the ledgers are marked: no worker takes one.
        await recovery.set_enabled(False)
        asked.append(change)
        await ask_bookie_state(address, change)

    with pytest.raises(DecommissionError, match=r"^autorecovery was disabled while draining"):
        await decommission(
            store, victim_id, timeout=10, wall_clock=lambda: 1.0, poll_interval=0.1,
            set_state=set_state,
        )  # fmt: skip
    assert asked == [StateChange.READ_ONLY]
    assert await recovery.decommissioning() == {victim_id}  # left draining, on purpose
    marks = [m async for m in recovery.marks()]
    assert [m.ledger_id for m in marks] == sorted(named)
    assert all(m.missing == (victim_id,) and m.reasons == ("decommission",) for m in marks)

    async def read_only() -> bool:
        states = [b.state for b in await store.list_bookies() if b.bookie_id == victim_id]
        return states == [READ_ONLY]

    await wait_until(read_only, every=0.1, timeout=10, what=f"{victim_id} registered read-only")
    done = await cancel(store, victim_id)
    assert (done.was_draining, done.asked_writable, done.problem) == (True, True, None)
    assert await recovery.decommissioning() == set()

    async def all_writable() -> bool:
        return all(b.writable for b in await store.list_bookies())

    await wait_until(all_writable, every=0.1, timeout=10, what="every bookie writable")
    # Enabled again, the workers find the bookie's copies in place: the marks go, it stays.
    await recovery.set_enabled(True)

    async def no_marks() -> bool:
        return not [m async for m in recovery.marks()]

    await wait_until(no_marks, every=0.2, timeout=20, what="no mark left")
    assert await ledgers_naming(store, victim_id) == named
    assert (await cancel(store, victim_id)).was_draining is False


@pytest.mark.timeout(60)
async def test_a_timeout_says_what_is_left_and_the_drain_goes_on(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """An open ledger waits its writer's grace period (1 s) before a worker closes it: a
    shorter timeout ends the command, not the drain."""
    store = bk.store
    writer = await BookKeeper.connect(cluster.uri, ClientConfig(explicit_lac_delay=0))
    idle = await writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    for i in range(5):
        await idle.append(b"open %d" % i)
    victim_id = idle.metadata.fragments[0].ensemble[1]

    async def elected() -> bool:
        return await store.autorecovery.auditor() is not None

    await wait_until(elected, every=0.1, timeout=20, what="an auditor elected")
    with pytest.raises(DecommissionError) as refused:
        await decommission(store, victim_id, timeout=0.3, wall_clock=time.time, poll_interval=0.1)
    message = str(refused.value)
    assert message.startswith("timed out after 0.3s: 1 ledger(s) still name"), message
    assert f"1 open ({idle.ledger_id})" in message
    assert "it stays marked for draining" in message
    assert await store.autorecovery.decommissioning() == {victim_id}

    async def drained() -> bool:  # the workers carry on without the command
        return not await ledgers_naming(store, victim_id)

    await wait_until(drained, every=0.2, timeout=20, what=f"no ledger names {victim_id}")
    assert (await cancel(store, victim_id)).was_draining
    with contextlib.suppress(BKError):
        await idle.close()
    await writer.close()
