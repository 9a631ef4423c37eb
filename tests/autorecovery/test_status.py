"""What ``aiobk autorecovery status`` and ``list-underreplicated`` gather
(``aiobk.autorecovery.status``), without the command line: from marks and an auditor's status
written by hand on a real etcd, and from a real auditor among real bookies."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery.status import (
    LostLedger,
    StatusReport,
    gather_status,
    under_replicated,
)
from aiobk.client import BookKeeper
from aiobk.metadata import (
    CHECK,
    LOST_BOOKIE,
    AuditorStatus,
    EtcdProcess,
    HeldLease,
    MetadataStore,
    open_store,
)
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until

FAST = {
    "registration_ttl": 1.0,
    "lost_bookie_recovery_delay": 0.5,
    "autorecovery_lease_ttl": 2.0,
    "autorecovery_poll_interval": 0.2,
    "rereplication_retry_delay": 0.2,
}


@pytest.fixture
async def store(etcd_server: EtcdProcess) -> AsyncIterator[MetadataStore]:
    opened = open_store(etcd_server.uri(unique_name("arstatus")))
    yield opened
    await opened.close()


async def seed(store: MetadataStore) -> HeldLease:
    """Marks of every kind, an elected auditor's status, a bookie draining, autorecovery off.
    Ledger 10 and 11 wait for repair, 12 is only a report of lost entries, 13 is both."""
    recovery = store.autorecovery
    await recovery.mark(10, ["b1:1"], LOST_BOOKIE, 1_000)
    await recovery.mark(11, ["b2:2", "b1:1"], CHECK, 2_000)
    twelve = await recovery.mark(12, ["b1:1"], LOST_BOOKIE, 3_000)
    await recovery.write_mark(dataclasses.replace(twelve, missing=()).with_lost([(0, 9)]))
    thirteen = await recovery.mark(13, ["b1:1"], LOST_BOOKIE, 4_000)
    await recovery.write_mark(thirteen.with_lost([(5, 5), (7, 8)]))
    lease = await HeldLease.grant(store.kv, 10.0, "test auditor")
    assert await recovery.elect("auditor-1", lease.id)
    published = AuditorStatus("auditor-1", {"b1:1": 500}, {"b2:2": 1_500}, 6_000, 7_000)
    await recovery.publish_status(published, lease.id)
    await recovery.set_decommissioning("b3:3", True)
    await recovery.set_enabled(False)
    return lease


@pytest.mark.timeout(30)
async def test_an_empty_store_reports_nothing_and_no_auditor(store: MetadataStore) -> None:
    report = await gather_status(store)
    assert report.to_document() == {
        "auditor": None,
        "enabled": True,
        "lost_bookies": {},
        "absent_bookies": {},
        "under_replicated_ledgers": 0,
        "lost_ledger_count": 0,
        "lost_ledgers": [],
        "last_check": None,
        "last_bookie_check": None,
        "status_from": None,
        "decommissioning": [],
    }
    assert await under_replicated(store) == []


@pytest.mark.timeout(30)
async def test_the_report_counts_marks_and_shows_the_auditors_status(store: MetadataStore) -> None:
    lease = await seed(store)
    try:
        report = await gather_status(store)
        assert report.lost_ledgers == (
            LostLedger(12, ((0, 9),)),
            LostLedger(13, ((5, 5), (7, 8))),
        )
        assert report.to_document() == {
            "auditor": "auditor-1",
            "enabled": False,
            "lost_bookies": {"b1:1": 500},
            "absent_bookies": {"b2:2": 1_500},
            "under_replicated_ledgers": 3,  # 10, 11, 13: 12 names no bookie any more
            "lost_ledger_count": 2,
            "lost_ledgers": [
                {"ledger_id": 12, "ranges": [[0, 9]]},
                {"ledger_id": 13, "ranges": [[5, 5], [7, 8]]},
            ],
            "last_check": 6_000,
            "last_bookie_check": 7_000,
            "status_from": "auditor-1",
            "decommissioning": ["b3:3"],
        }
        waiting = await under_replicated(store, with_claims=True)
        assert [m.mark.ledger_id for m in waiting] == [10, 11, 13]
        assert waiting[1].to_document() == {
            "ledger_id": 11,
            "missing": ["b1:1", "b2:2"],
            "since": 2_000,
            "reasons": [CHECK],
            "lost": [],
            "claimed_by": None,
        }
        # A worker's claim shows as who repairs the ledger now.
        assert await store.autorecovery.claim(13, "worker-7", lease.id) is not None
        waiting = await under_replicated(store, with_claims=True)
        assert [m.claimed_by for m in waiting] == [None, None, "worker-7"]
        assert waiting[2].to_document()["lost"] == [[5, 5], [7, 8]]
        # Without asking, no claim is read.
        assert [m.claimed_by for m in await under_replicated(store)] == [None, None, None]
    finally:
        await lease.close()
    # The auditor's seat and status go with its lease; the marks stay.
    after = await gather_status(store)
    assert (after.auditor, after.status_from, after.last_check) == (None, None, None)
    assert after.under_replicated == 3


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("arstatus"))
    cluster = await start_cluster(tmp_path, 4, uri=uri, **FAST)
    yield cluster
    await cluster.stop()


@pytest.mark.timeout(60)
async def test_a_real_auditor_reports_a_lost_bookie_and_its_ledgers(cluster: Cluster) -> None:
    """Autorecovery disabled, so the mark stays to be seen; enabled, the report empties."""
    async with BookKeeper(cluster.uri) as bk:
        store = bk.store
        await store.autorecovery.set_enabled(False)
        lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        for i in range(10):
            await lh.append(b"e%d" % i)
        await lh.close()
        victim_id = lh.metadata.fragments[0].ensemble[1]
        victim = cluster.by_id(victim_id)
        await victim.crash()
        cluster.bookies.remove(victim)
        shutil.rmtree(victim.config.data_dir)
        reports: list[StatusReport] = []

        async def lost_and_marked() -> bool:
            reports.append(await gather_status(store))
            return victim_id in reports[-1].lost_bookies and reports[-1].under_replicated == 1

        await wait_until(
            lost_and_marked, every=0.2, timeout=30, what=f"{victim_id} lost, its ledger marked"
        )
        report = reports[-1]
        assert report.auditor in {b.bookie_id for b in cluster.bookies}
        assert report.status_from == report.auditor
        assert report.last_bookie_check is not None
        assert report.enabled is False
        assert victim_id not in report.absent_bookies
        (waiting,) = await under_replicated(store)
        assert (waiting.mark.ledger_id, waiting.mark.missing) == (lh.ledger_id, (victim_id,))
        assert waiting.mark.reasons == (LOST_BOOKIE,)
        await store.autorecovery.set_enabled(True)

        async def repaired() -> bool:
            return not (await gather_status(store)).under_replicated

        await wait_until(repaired, every=0.2, timeout=30, what="no ledger under-replicated")
        assert await under_replicated(store) == []
        rh = await bk.open_ledger(lh.ledger_id, recovery=False)
        assert victim_id not in rh.metadata.fragments[0].ensemble
        assert [e.data for e in await rh.read(0, 9)] == [b"e%d" % i for i in range(10)]
