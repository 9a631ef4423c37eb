"""The offload pass the elected auditor runs: a log's policy offloads its due ledgers, copied
ledgers are released after the store's deletion lag, and the store is swept -- on real
in-process bookies, a real directory store and autorecovery's own election."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery.config import AutoRecoveryConfig
from aiobk.autorecovery.offload_pass import OffloadPass
from aiobk.client import BookKeeper
from aiobk.metadata import OffloadPolicy, OffloadState, OffloadStoreSettings
from tests.support.cluster import Cluster, start_cluster
from tests.support.wait import wait_until


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 3)
    try:
        yield cluster
    finally:
        await cluster.stop()


async def three_ledgers(bk: BookKeeper, name: str) -> list[bytes]:
    sent: list[bytes] = []
    for ledger in range(3):
        async with await bk.open_log_writer(name) as writer:
            batch = [b"%d-%d" % (ledger, i) for i in range(10)]
            await asyncio.gather(*(writer.append(record) for record in batch))
            sent += batch
    return sent


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_a_policy_offloads_due_ledgers_and_the_lag_holds_their_release(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "objects").mkdir()
    url = f"file://{tmp_path / 'objects'}"
    clock = Clock()
    async with BookKeeper(cluster.uri) as bk:
        await bk.store.set_offload_store(OffloadStoreSettings(url, deletion_lag=600))
        sent = await three_ledgers(bk, "kept")
        await three_ledgers(bk, "untouched")  # no policy: never offloaded
        await bk.store.set_offload_policy("kept", OffloadPolicy(beyond_bytes=0))
        offloads = OffloadPass(bk.context, AutoRecoveryConfig(), wall_clock=clock)
        try:
            first = await offloads.once()
            kept = list((await bk.store.read_log("kept")).ledgers)
            assert sorted(first.offloaded) == sorted(kept[:2])  # never the log's last
            assert first.released == first.errors == []
            clock.now += 601
            second = await offloads.once()
            assert sorted(second.released) == sorted(kept[:2])
            assert second.offloaded == []
            for ledger_id in kept[:2]:
                record = (await bk.store.read_ledger(ledger_id)).offload
                assert record is not None
                assert record.state is OffloadState.RELEASED
            untouched = (await bk.store.read_log("untouched")).ledgers
            for ledger_id in untouched:
                assert (await bk.store.read_ledger(ledger_id)).offload is None
        finally:
            await offloads.objects.close()
        for bookie in cluster.bookies:
            assert len((await bookie.collect_garbage(forced=True)).ledgers_released) == 2
        reader = await bk.open_log_reader("kept", follow=False)
        assert [record.data async for record in reader] == sent


@pytest.mark.timeout(60)
async def test_the_elected_auditor_among_the_bookies_runs_the_pass(tmp_path: Path) -> None:
    cluster = await start_cluster(tmp_path, 3, offload_interval=0.2)
    (tmp_path / "objects").mkdir()
    try:
        async with BookKeeper(cluster.uri) as bk:
            await bk.store.set_offload_store(
                OffloadStoreSettings(f"file://{tmp_path / 'objects'}", deletion_lag=0)
            )
            await three_ledgers(bk, "auto")
            await bk.store.set_offload_policy("auto", OffloadPolicy(older_than=0))
            ledgers = list((await bk.store.read_log("auto")).ledgers)

            async def released() -> bool:
                for ledger_id in ledgers[:2]:
                    record = (await bk.store.read_ledger(ledger_id)).offload
                    if record is None or record.state is not OffloadState.RELEASED:
                        return False
                return True

            await wait_until(released, timeout=30, what="the due ledgers released")
            assert (await bk.store.read_ledger(ledgers[2])).offload is None
    finally:
        await cluster.stop()
