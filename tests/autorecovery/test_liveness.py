"""Read-only bookies count as alive: a bookie an operator set read-only, and one whose
disk is full, stay read-only past ``lost_bookie_recovery_delay`` while a third bookie dies; the
auditor (a real one, on a real etcd, among real bookies) declares only the dead one lost and
marks no ledger for the read-only ones."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery import AutoRecovery, AutoRecoveryConfig
from aiobk.autorecovery.decommission import ask_bookie_state
from aiobk.autorecovery.fragments import bookies_named
from aiobk.bookie import Bookie, BookieConfig
from aiobk.client import BookKeeper
from aiobk.metadata import LOST_BOOKIE, READ_ONLY, AuditorStatus, EtcdProcess
from aiobk.protocol import StateChange
from aiobk.runner import make_bookie
from tests.autorecovery.watching import key_until, registry_until, unregistered, watching_marks
from tests.support.cluster import Cluster, start_cluster
from tests.support.faulty_disk import FaultyDisk
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS

SETTINGS = {"registration_ttl": 1.0, "autorecovery_enabled": False}
DELAY = 1.0  # lost_bookie_recovery_delay
# The disk-full bookie judges its (fake) usage: full above 95%, writable again under 90%; its
# monitor is driven by the test, not by a timer.
DISK_SETTINGS = {
    "disk_usage_threshold": 0.95,
    "disk_usage_warn_threshold": 0.95,
    "disk_usage_lwm_threshold": 0.90,
    "disk_check_interval": 3600.0,
}


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("liveness"))
    cluster = await start_cluster(tmp_path, 4, uri=uri, **SETTINGS)
    yield cluster
    await cluster.stop()


async def _add_on_faulty_disk(cluster: Cluster, disk: FaultyDisk) -> Bookie:
    """A fifth bookie as the cluster would add it, on real files whose usage the test sets."""
    config = BookieConfig(
        data_dir=str(cluster.root / f"bookie{len(cluster.bookies)}"),
        port=0,
        metadata_uri=cluster.uri,
        **{**HOST_DISK_SETTINGS, **cluster.settings, **DISK_SETTINGS},
    )
    bookie = make_bookie(config, disk=disk)
    await bookie.start()
    cluster.bookies.append(bookie)
    return bookie


@pytest.mark.timeout(60)
async def test_read_only_bookies_are_not_lost_while_a_dead_one_is(cluster: Cluster) -> None:
    disk = FaultyDisk()
    full = await _add_on_faulty_disk(cluster, disk)
    operator, dead = cluster.bookies[0], cluster.bookies[1]
    config = AutoRecoveryConfig(
        lost_bookie_recovery_delay=DELAY,
        autorecovery_lease_ttl=2.0,
        autorecovery_poll_interval=0.1,
    )
    service = AutoRecovery(
        cluster.store,
        config,
        "auditor-node",
        rng=random.Random(1),
        wall_clock=time.time,
        secret_bytes=random.Random(1).randbytes,
        run_worker=False,  # the marks stay as the auditor made them
    )
    async with BookKeeper(cluster.uri) as bk:
        store = bk.store
        # One ledger on all five bookies: a mark on it names exactly the bookies held lost.
        lh = await bk.create_ledger(ensemble_size=5, write_quorum=5, ack_quorum=3)
        for i in range(10):
            await lh.append(b"entry %d" % i)
        await lh.close()
        assert len(bookies_named(lh.metadata)) == 5
        await service.start()
        try:
            await key_until(store, store.keys.auditor, lambda v: v is not None, 10)
            # Read-only: one by its operator (the request `aiobk bookie state` sends), one
            # because its disk is 96% full.
            await ask_bookie_state(str(operator.address), StateChange.READ_ONLY)
            disk.free = int(0.04 * (1 << 40))
            await full.disk_monitor.check()
            assert not full.write_state.writable
            read_only = {operator.bookie_id, full.bookie_id}
            await registry_until(
                store,
                lambda bs: {b.bookie_id for b in bs if b.state == READ_ONLY} == read_only,
                10,
            )
            async with watching_marks(store) as marks:
                await dead.crash()
                await unregistered(store, dead.bookie_id)
                # The dead bookie's mark comes once it has been absent DELAY seconds; the
                # read-only ones have been read-only longer than that by then.
                found = await marks.until(lambda m: lh.ledger_id in m, 20)
            mark = found[lh.ledger_id]
            assert (mark.missing, mark.reasons) == ((dead.bookie_id,), (LOST_BOOKIE,))
            assert list(found) == [lh.ledger_id]
            published = await key_until(
                store,
                store.keys.autorecovery_status,
                lambda v: (
                    v is not None and dead.bookie_id in AuditorStatus.from_json(v).lost_bookies
                ),
                10,
            )
            assert published is not None
            status = AuditorStatus.from_json(published)
            assert set(status.lost_bookies) == {dead.bookie_id}
            assert status.missing_bookies == {}  # never absent, not even for a moment
            assert service.auditor is not None
            assert service.auditor.lost == {dead.bookie_id}
            # Still read-only and still registered: nothing changed for them.
            states = {b.bookie_id: b.state for b in await store.list_bookies()}
            assert {b: states.get(b) for b in read_only} == dict.fromkeys(read_only, READ_ONLY)
        finally:
            await service.stop()
