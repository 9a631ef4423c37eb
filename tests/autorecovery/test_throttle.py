"""``rereplication_max_bytes_per_second`` holds: a worker re-replicating N bytes with
a limit of R bytes a second takes at least about N / R seconds, and with no limit it is not
held back. Real bookies on a real etcd; the worker is driven directly, one repair timed."""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery import AutoRecoveryConfig, Outcome, ReplicationWorker
from aiobk.autorecovery.fragments import bookies_named
from aiobk.client import BookKeeper
from aiobk.client.entry_read import ask
from aiobk.metadata import LOST_BOOKIE, EtcdProcess
from aiobk.protocol import StatusCode
from tests.autorecovery.watching import unregistered
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name

SETTINGS = {"registration_ttl": 1.0, "autorecovery_enabled": False}
ENTRIES = 60
PAYLOAD = 2000  # bytes per entry: about 121 KB to copy in all
RATE = 40_000  # bytes a second: about 3 s for the copy
SLACK = 0.9  # of the least time the limit allows


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("throttle"))
    cluster = await start_cluster(tmp_path, 4, uri=uri, **SETTINGS)
    yield cluster
    await cluster.stop()


async def _timed_repair(cluster: Cluster, rate: int) -> tuple[float, int, int]:
    """A closed E3 WQ3 ledger whose bookie in slot 0 is lost, repaired by a worker limited to
    ``rate``: (seconds the repair took, bytes it re-replicated, the largest entry's bytes)."""
    async with BookKeeper(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        for i in range(ENTRIES):
            await lh.append(b"%04d" % i + bytes(PAYLOAD - 4))
        await lh.close()
        lost = lh.metadata.fragments[0].ensemble[0]
        source = lh.metadata.fragments[0].ensemble[1]
        sizes = []
        for entry_id in range(ENTRIES):
            response = await ask(bk.pool, source, lh.ledger_id, entry_id, 5.0)
            assert response.status is StatusCode.EOK
            assert response.body is not None
            sizes.append(len(response.body))
        bookie = cluster.by_id(lost)
        cluster.bookies.remove(bookie)
        await bookie.crash()
        shutil.rmtree(bookie.config.data_dir)
        await unregistered(bk.store, lost)
        config = AutoRecoveryConfig(
            lost_bookie_recovery_delay=0.0, rereplication_max_bytes_per_second=rate
        )
        worker = ReplicationWorker(
            bk.context,
            config,
            "test-worker",
            wall_clock=time.time,
            secret_bytes=random.Random(5).randbytes,
        )
        mark = await bk.store.autorecovery.mark(lh.ledger_id, [lost], LOST_BOOKIE, 0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await worker.repair(mark) is Outcome.REPAIRED
        took = loop.time() - started
        assert lost not in bookies_named(await bk.store.read_ledger(lh.ledger_id))
        assert worker.stats.entries_replicated == ENTRIES
        assert worker.stats.bytes_replicated == sum(sizes)
        return took, worker.stats.bytes_replicated, max(sizes)


@pytest.mark.timeout(60)
async def test_a_byte_rate_limit_holds_the_copy_to_at_least_its_time(cluster: Cluster) -> None:
    took, copied, largest = await _timed_repair(cluster, RATE)
    # The throttle books each entry's bytes before it moves: the last one waits for all the
    # others to have had their share of time.
    least = (copied - largest) / RATE
    assert least > 2.5
    assert took >= SLACK * least, (took, least)


@pytest.mark.timeout(60)
async def test_without_a_limit_the_copy_is_not_held_back(cluster: Cluster) -> None:
    took, copied, _largest = await _timed_repair(cluster, 0)
    # The same copy a limit of RATE would hold for about 3 s.
    assert took < 0.5 * copied / RATE, took
