"""An open ledger whose writer moves off a lost bookie by itself: within
``open_ledger_rereplication_grace_period`` the worker leaves the writer's fragment alone; once
the writer has changed its ensemble, the worker copies the closed fragment that still names the
lost bookie and clears the mark -- without fencing or recovering the ledger, whose writer keeps
writing and closes it itself. Real bookies on a real etcd; the worker driven directly."""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery import AutoRecoveryConfig, Outcome, ReplicationWorker
from aiobk.autorecovery.fragments import bookies_named
from aiobk.client import BookKeeper, ClientConfig
from aiobk.metadata import LOST_BOOKIE, EtcdProcess, LedgerState
from tests.autorecovery.helpers import assert_copies
from tests.autorecovery.watching import ledger_until, unregistered
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name

SETTINGS = {"registration_ttl": 1.0, "autorecovery_enabled": False}
GRACE = 30.0  # far longer than the test: the worker must not wait it out
CONFIG = AutoRecoveryConfig(
    lost_bookie_recovery_delay=0.0,
    open_ledger_rereplication_grace_period=GRACE,
    rereplication_retry_delay=0.2,
    autorecovery_poll_interval=0.1,
)


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("openwriter"))
    cluster = await start_cluster(tmp_path, 5, uri=uri, **SETTINGS)
    yield cluster
    await cluster.stop()


@pytest.mark.timeout(60)
async def test_a_writer_that_moves_off_the_lost_bookie_keeps_its_ledger_open(
    cluster: Cluster,
) -> None:
    async with (
        BookKeeper(cluster.uri, ClientConfig(read_timeout=2.0)) as bk,
        BookKeeper(cluster.uri, ClientConfig(explicit_lac_delay=0, add_timeout=2.0)) as writer,
    ):
        store = bk.store
        # AQ = WQ: every add is on all three bookies when it returns, none still in flight.
        lh = await writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        for i in range(10):
            await lh.append(b"before %d" % i)
        victim = lh.metadata.fragments[-1].ensemble[1]
        bookie = cluster.by_id(victim)
        cluster.bookies.remove(bookie)
        await bookie.crash()
        shutil.rmtree(bookie.config.data_dir)
        await unregistered(store, victim)
        mark = await store.autorecovery.mark(
            lh.ledger_id, [victim], LOST_BOOKIE, int(time.time() * 1000)
        )
        worker = ReplicationWorker(
            bk.context,
            CONFIG,
            "test-worker",
            wall_clock=time.time,
            secret_bytes=random.Random(5).randbytes,
        )
        assert await worker.repair(mark) is Outcome.DEFERRED  # the writer may fix it itself
        # It does: its next add meets the lost bookie and it changes its ensemble.
        await lh.append(b"after 10")
        moved = await ledger_until(
            store, lh.ledger_id, lambda m: m is not None and len(m.fragments) == 2, 10
        )
        assert moved is not None
        assert victim in moved.fragments[0].ensemble
        assert victim not in moved.fragments[1].ensemble
        assert await worker.repair(mark) is Outcome.REPAIRED  # well within the grace period
        repaired = await store.read_ledger(lh.ledger_id)
        assert repaired.state is LedgerState.OPEN  # not fenced, not recovered
        assert victim not in bookies_named(repaired)
        assert repaired.fragments[1] == moved.fragments[1]  # the writer's fragment untouched
        assert await store.autorecovery.read_mark(lh.ledger_id) is None
        assert worker.stats.ledgers_recovered == 0
        assert worker.stats.entries_replicated == moved.fragments[1].first_entry_id
        # The writer goes on: no bookie of its ensemble was fenced.
        for i in range(11, 20):
            await lh.append(b"after %d" % i)
        await lh.close()
        closed = await store.read_ledger(lh.ledger_id)
        assert closed.is_closed
        assert closed.last_entry_id == 19
        assert victim not in bookies_named(closed)
        await assert_copies(bk, lh.ledger_id)
