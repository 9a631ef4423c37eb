"""Autorecovery end to end with real bookies in process (memory store): a bookie lost for good
has its copies made again elsewhere, and nothing names it any more."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper
from tests.autorecovery.helpers import FAST, assert_copies
from tests.support.cluster import Cluster, forget, start_cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 5, **FAST)
    yield cluster
    await cluster.stop()
    forget(cluster)


@pytest.mark.timeout(90)
async def test_a_lost_bookies_copies_come_back(cluster: Cluster) -> None:
    async with BookKeeper(cluster.uri) as bk:
        ids = []
        for _ in range(4):
            lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            for i in range(30):
                await lh.append(b"entry %d" % i)
            await lh.close()
            ids.append(lh.ledger_id)
        victim_id = (await bk.open_ledger(ids[0], recovery=False)).metadata.fragments[0].ensemble[0]
        victim = cluster.by_id(victim_id)
        await victim.crash()
        cluster.bookies.remove(victim)
        shutil.rmtree(victim.config.data_dir)
        store = bk.store
        async with asyncio.timeout(60):
            while True:
                named = []
                for ledger_id in ids:
                    metadata = await store.read_ledger(ledger_id)
                    if any(victim_id in f.ensemble for f in metadata.fragments):
                        named.append(ledger_id)
                marks = [m async for m in store.autorecovery.marks()]
                if not named and not marks:
                    break
                await asyncio.sleep(0.2)
        for ledger_id in ids:
            metadata = await store.read_ledger(ledger_id)
            await assert_copies(bk, ledger_id, read_back=False)
            rh = await bk.open_ledger(ledger_id, recovery=False)
            entries = await rh.read(0, 29)
            assert [e.data for e in entries] == [b"entry %d" % i for i in range(30)]
