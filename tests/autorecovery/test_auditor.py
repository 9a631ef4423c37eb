"""The auditor's checks on real bookies in process (memory store), driven step by step: when a
missing bookie becomes lost, what a bookie check marks, what the periodic check finds, and the
election among several processes."""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery import Auditor, AutoRecovery, AutoRecoveryConfig, AutoRecoveryStats
from aiobk.client import BookKeeper, ClientConfig
from aiobk.metadata import CHECK, LOST_BOOKIE, HeldLease
from tests.support.cluster import Cluster, forget, start_cluster
from tests.support.wait import wait_until

SETTINGS = {"registration_ttl": 1.0, "autorecovery_enabled": False}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 4, **SETTINGS)
    yield cluster
    await cluster.stop()
    forget(cluster)


@pytest.fixture
async def bk(cluster: Cluster) -> AsyncIterator[BookKeeper]:
    async with BookKeeper(cluster.uri, ClientConfig(read_timeout=2.0)) as bk:
        yield bk


def _auditor(bk: BookKeeper, **settings: float) -> Auditor:
    config = AutoRecoveryConfig(**{"lost_bookie_recovery_delay": 1.0, **settings})
    return Auditor(
        bk.context, config, "test-auditor", stats=AutoRecoveryStats(), wall_clock=time.time
    )


async def _closed(bk: BookKeeper, entries: int = 10) -> int:
    lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    for i in range(entries):
        await lh.append(b"%d" % i)
    await lh.close()
    return lh.ledger_id


async def _gone(cluster: Cluster, bookie_id: str) -> None:
    async def gone() -> bool:
        return bookie_id not in {b.bookie_id for b in await cluster.store.list_bookies()}

    await wait_until(gone, every=0.1, timeout=10, what=f"{bookie_id} left the registry")


@pytest.mark.timeout(60)
async def test_a_missing_bookie_is_lost_only_after_the_delay(
    cluster: Cluster, bk: BookKeeper
) -> None:
    ledger_id = await _closed(bk)
    auditor = _auditor(bk)
    await auditor.bookie_check()  # learns the bookies the ledgers name
    assert await auditor._watch_registry() == set()
    victim = (await bk.store.read_ledger(ledger_id)).fragments[0].ensemble[0]
    bookie = cluster.by_id(victim)
    await bookie.crash()
    await _gone(cluster, victim)
    assert await auditor._watch_registry() == set()  # absent, not lost yet
    await asyncio.sleep(1.1)
    assert await auditor._watch_registry() == {victim}
    await auditor.bookie_check()
    mark = await bk.store.autorecovery.read_mark(ledger_id)
    assert mark is not None
    assert (mark.missing, mark.reasons) == ((victim,), (LOST_BOOKIE,))


@pytest.mark.timeout(60)
async def test_a_bookie_back_within_the_delay_costs_nothing(
    cluster: Cluster, bk: BookKeeper
) -> None:
    ledger_id = await _closed(bk)
    auditor = _auditor(bk, lost_bookie_recovery_delay=3.0)
    await auditor.bookie_check()
    victim = (await bk.store.read_ledger(ledger_id)).fragments[0].ensemble[1]
    bookie = cluster.by_id(victim)
    await bookie.crash()
    await _gone(cluster, victim)
    assert await auditor._watch_registry() == set()
    await cluster.restart(bookie)
    assert await auditor._watch_registry() == set()
    await asyncio.sleep(3.1)
    assert await auditor._watch_registry() == set()  # its clock stopped when it came back
    await auditor.bookie_check()
    assert await bk.store.autorecovery.read_mark(ledger_id) is None


@pytest.mark.timeout(60)
async def test_the_periodic_check_finds_copies_a_live_bookie_lost(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """A bookie whose disk was replaced comes back empty under its old id (cookie fixed, no
    self-repair): the lost-bookie check sees nothing wrong, the periodic check does."""
    ledger_id = await _closed(bk)
    other = await _closed(bk)
    victim = (await bk.store.read_ledger(ledger_id)).fragments[0].ensemble[2]
    bookie = cluster.by_id(victim)
    await bookie.stop()
    shutil.rmtree(bookie.config.data_dir)
    empty = bookie.config.with_changes(
        port=bookie.address.port, allow_cookie_fix=True, boot_repair=False
    )
    from aiobk.runner import make_bookie

    fresh = make_bookie(empty)
    await fresh.start()
    cluster.bookies[cluster.bookies.index(bookie)] = fresh
    await bk.store.autorecovery.mark(424242, ["x:1"], CHECK, 0)  # a deleted ledger's mark
    auditor = _auditor(bk)
    await auditor.check_all()
    mark = await bk.store.autorecovery.read_mark(ledger_id)
    assert mark is not None
    assert (mark.missing, mark.reasons) == ((victim,), (CHECK,))
    named = victim in (await bk.store.read_ledger(other)).fragments[0].ensemble
    assert (await bk.store.autorecovery.read_mark(other) is not None) == named
    assert await bk.store.autorecovery.read_mark(424242) is None  # dropped
    assert auditor.stats.ledgers_checked == 2


@pytest.mark.timeout(60)
async def test_one_auditor_and_the_next_takes_over_when_its_lease_lapses(
    cluster: Cluster,
) -> None:
    config = AutoRecoveryConfig(autorecovery_lease_ttl=1.0, autorecovery_poll_interval=0.1)
    services = [
        AutoRecovery(
            cluster.store,
            config,
            f"node-{i}",
            rng=random.Random(i),
            wall_clock=time.time,
            secret_bytes=random.Random(i).randbytes,
            run_worker=False,
        )
        for i in range(3)
    ]
    for service in services:
        await service.start()
    try:
        await wait_until(
            lambda: sum(s.auditor is not None for s in services) == 1,
            timeout=10,
            what="one auditor elected",
        )
        first = next(s for s in services if s.auditor is not None)
        assert await cluster.store.autorecovery.auditor() == first.node_id
        await first.stop()  # revokes its lease: the seat is free at once

        async def succeeded() -> bool:
            return (await cluster.store.autorecovery.auditor()) not in (None, first.node_id)

        await wait_until(succeeded, timeout=10, what="another node took the auditor's seat")
        assert sum(s.auditor is not None for s in services if s is not first) == 1
    finally:
        for service in services:
            await service.stop()


@pytest.mark.timeout(30)
async def test_an_auditor_whose_lease_is_lost_stops_and_stands_again(cluster: Cluster) -> None:
    service = AutoRecovery(
        cluster.store,
        AutoRecoveryConfig(autorecovery_lease_ttl=1.0, autorecovery_poll_interval=0.1),
        "node",
        rng=random.Random(1),
        wall_clock=time.time,
        secret_bytes=random.Random(1).randbytes,
        run_worker=False,
    )
    await service.start()
    try:
        await wait_until(lambda: service.auditor is not None, timeout=10, what="elected")
        store = cluster.store
        found, _rev = await store.kv.get(store.keys.auditor)
        assert found is not None
        await store.kv.revoke_lease(found.lease)  # lost behind its back
        await wait_until(
            lambda: service.auditor is not None and service.stats.auditor_elections >= 2,
            timeout=10,
            what="elected a second time",
        )
        assert await store.autorecovery.auditor() == "node"  # stood again and won
    finally:
        await service.stop()


@pytest.mark.timeout(60)
async def test_a_lost_bookie_no_ledger_names_any_more_is_forgotten(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """Once its ledgers are gone (moved, deleted, or it was decommissioned), a lost bookie is no
    longer reported lost."""
    ledger_id = await _closed(bk)
    auditor = _auditor(bk, lost_bookie_recovery_delay=0.0)
    await auditor.bookie_check()
    victim = (await bk.store.read_ledger(ledger_id)).fragments[0].ensemble[0]
    await cluster.by_id(victim).crash()
    await _gone(cluster, victim)
    assert await auditor._watch_registry() == {victim}
    await auditor.bookie_check()
    assert auditor.lost == {victim}
    await bk.delete_ledger(ledger_id)
    await auditor.bookie_check()
    assert auditor.lost == set()
    assert auditor.stats.lost_bookies == 0
    assert await auditor._watch_registry() == set()


@pytest.mark.timeout(60)
async def test_an_audit_asked_for_while_no_auditor_runs_is_served_by_the_next(
    cluster: Cluster, bk: BookKeeper
) -> None:
    marks = bk.store.autorecovery
    asked = await marks.request_audit()  # nobody audits yet
    assert await marks.audit_served() == 0
    auditor = _auditor(bk, auditor_periodic_check_interval=0.0)
    lease = await HeldLease.grant(bk.store.kv, 10, "test")
    task = asyncio.get_running_loop().create_task(auditor.run(lease))
    try:

        async def served() -> bool:
            return await marks.audit_served() >= asked

        await wait_until(served, every=0.1, timeout=20, what="the audit asked for is served")
        assert auditor._last_check > 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await lease.close()
