"""etcd at scale (issue 15): every allocation, creation and deletion of a ledger is an etcd
revision, and etcd keeps every revision until compacted -- then refuses all writes at its quota.
100,000 ledgers allocated, created and deleted on a real etcd, with the store compacting its
history as each bookie's GC pass does: the database stops growing. Also measures the metadata
bytes one ledger costs in etcd."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aiobk.metadata import EtcdProcess, Fragment, LedgerMetadata, MetadataStore, open_store
from aiobk.metadata.kv_etcd import EtcdKV

ENSEMBLE = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
ROUNDS = 10
PER_ROUND = 10_000
KEEP = 10_000  # revisions of history kept at each compaction
CONCURRENCY = 64


async def _churn(store: MetadataStore, count: int) -> None:
    """``count`` ledgers allocated, created and deleted (three revisions each)."""
    metadata = LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),))
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with gate:
            ledger_id = await store.allocate_ledger_id()
            await store.create_ledger(ledger_id, metadata)
            await store.delete_ledger(ledger_id)

    await asyncio.gather(*(one() for _ in range(count)))


@pytest.fixture
def etcd(tmp_path: Path) -> EtcdProcess:
    # No --auto-compaction here: what bounds the history is the store's own compaction.
    server = EtcdProcess(data_dir=str(tmp_path / "etcd")).start()
    yield server  # type: ignore[misc]
    server.stop()


@pytest.mark.timeout(600)
async def test_100000_ledgers_churned_leave_the_etcd_database_bounded(
    etcd: EtcdProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(etcd.uri("scale"))
    kv = store.kv
    assert isinstance(kv, EtcdKV)
    sizes = []
    try:
        for _ in range(ROUNDS):
            await _churn(store, PER_ROUND)
            assert await store.compact_history(keep=KEEP) > 0
            sizes.append(await kv.db_size())
    finally:
        await store.close()
    with capsys.disabled():
        print(f"\netcd database after each {PER_ROUND:,} ledgers churned, compacted: {sizes}")
    # Without compaction each round adds its 30,000 revisions (the file grows ~6 MB a round,
    # 60 MB in all); with it, freed pages are reused and the file stops growing early.
    assert max(sizes[ROUNDS // 2 :]) <= 1.25 * sizes[2], sizes


async def test_what_a_ledger_costs_in_etcd(etcd: EtcdProcess) -> None:
    """Metadata bytes per ledger (key and JSON value of an open three-bookie ledger)."""
    store = open_store(etcd.uri("cost"))
    try:
        metadata = LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),), custom_metadata={})
        for _ in range(100):
            await store.create_ledger(await store.allocate_ledger_id(), metadata)
        found, _revision = await store.kv.range(store.keys.ledgers, limit=1000)
    finally:
        await store.close()
    per_ledger = sum(len(kv.key) + len(kv.value) for kv in found) / len(found)
    print(f"metadata bytes per ledger in etcd: {per_ledger:.0f}")
    assert len(found) == 100
    assert per_ledger < 1024
