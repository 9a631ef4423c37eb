"""The auditor's timers fire on their own: with no registry change and no
``trigger-audit``, ``auditor_periodic_bookie_check_interval`` runs the lost-bookie check and
``auditor_periodic_check_interval`` the full check. A real auditor (an autorecovery service
with no worker, so its marks stay) among real bookies on a real etcd."""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery import AutoRecovery, AutoRecoveryConfig
from aiobk.client import BookKeeper
from aiobk.metadata import CHECK, LOST_BOOKIE, AuditorStatus, EtcdProcess, MetadataStore
from aiobk.runner import make_bookie
from tests.autorecovery.watching import key_until, unregistered, watching_marks
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name

SETTINGS = {"registration_ttl": 1.0, "autorecovery_enabled": False}
INTERVAL = 1.0  # the timer under test


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("periodic"))
    cluster = await start_cluster(tmp_path, 4, uri=uri, **SETTINGS)
    yield cluster
    await cluster.stop()


def _auditor(cluster: Cluster, **settings: float) -> AutoRecovery:
    config = AutoRecoveryConfig(
        autorecovery_lease_ttl=2.0, autorecovery_poll_interval=0.1, **settings
    )
    return AutoRecovery(
        cluster.store,
        config,
        "auditor-node",
        rng=random.Random(1),
        wall_clock=time.time,
        secret_bytes=random.Random(1).randbytes,
        run_worker=False,
    )


async def _closed(bk: BookKeeper, entries: int = 10) -> int:
    lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
    for i in range(entries):
        await lh.append(b"entry %d" % i)
    await lh.close()
    return lh.ledger_id


async def _no_audit_asked(store: MetadataStore) -> None:
    assert await store.autorecovery.audit_requested() == 0


@pytest.mark.timeout(60)
async def test_the_periodic_bookie_check_marks_what_a_lost_bookie_left_unmarked(
    cluster: Cluster,
) -> None:
    """A lost bookie's ledger whose mark went (removed by hand) is marked again by the next
    periodic lost-bookie check: the bookie is long gone, so no registry change brings it."""
    service = _auditor(
        cluster,
        lost_bookie_recovery_delay=0.2,
        auditor_periodic_bookie_check_interval=INTERVAL,
        auditor_periodic_check_interval=0.0,  # never: only the bookie check can mark
    )
    async with BookKeeper(cluster.uri) as bk:
        store = bk.store
        ledger_id = await _closed(bk)
        victim = (await store.read_ledger(ledger_id)).fragments[0].ensemble[0]
        await service.start()
        try:
            await key_until(store, store.keys.auditor, lambda v: v is not None, 10)
            async with watching_marks(store) as marks:
                bookie = cluster.by_id(victim)
                cluster.bookies.remove(bookie)
                await bookie.crash()
                shutil.rmtree(bookie.config.data_dir)
                await unregistered(store, victim)
                found = await marks.until(lambda m: ledger_id in m, 10)  # newly lost
                await key_until(
                    store,
                    store.keys.autorecovery_status,
                    lambda v: v is not None and victim in AuditorStatus.from_json(v).lost_bookies,
                    10,
                )
                for _round in range(2):  # the timer fires again and again
                    await store.autorecovery.unmark(found[ledger_id])
                    await marks.until(lambda m: ledger_id not in m, 5)
                    found = await marks.until(lambda m: ledger_id in m, 3 * INTERVAL + 2)
                    mark = found[ledger_id]
                    assert (mark.missing, mark.reasons) == ((victim,), (LOST_BOOKIE,))
            assert victim not in {b.bookie_id for b in await store.list_bookies()}
            await _no_audit_asked(store)
        finally:
            await service.stop()


@pytest.mark.timeout(60)
async def test_the_periodic_full_check_finds_copies_a_live_bookie_lost(cluster: Cluster) -> None:
    """A bookie whose disk was replaced comes back empty under its old id (cookie fixed, no
    self-repair): it never left for long enough to be lost, so only the full check, run by its
    timer, can find its copies missing -- and finds them again once the mark is removed."""
    service = _auditor(
        cluster,
        lost_bookie_recovery_delay=60.0,  # never lost within the test
        auditor_periodic_check_interval=INTERVAL,
    )
    async with BookKeeper(cluster.uri) as bk:
        store = bk.store
        ledger_id = await _closed(bk)
        victim = (await store.read_ledger(ledger_id)).fragments[0].ensemble[2]
        bookie = cluster.by_id(victim)
        await bookie.stop()
        shutil.rmtree(bookie.config.data_dir)
        empty = bookie.config.with_changes(
            port=bookie.address.port, allow_cookie_fix=True, boot_repair=False
        )
        fresh = make_bookie(empty)
        await fresh.start()
        cluster.bookies[cluster.bookies.index(bookie)] = fresh
        async with watching_marks(store) as marks:
            await service.start()
            try:
                found = await marks.until(lambda m: ledger_id in m, 3 * INTERVAL + 5)
                for _round in range(2):
                    mark = found[ledger_id]
                    assert (mark.missing, mark.reasons) == ((victim,), (CHECK,))
                    await store.autorecovery.unmark(mark)
                    await marks.until(lambda m: ledger_id not in m, 5)
                    found = await marks.until(lambda m: ledger_id in m, 3 * INTERVAL + 2)
                assert service.stats.ledgers_checked >= 3
                await _no_audit_asked(store)
            finally:
                await service.stop()
