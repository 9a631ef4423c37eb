"""Spark reads offloaded ledgers from their objects: the same rows as from the bookies, with
no bookie running, and a damaged object is a clear error rather than wrong rows.

The cluster is this test's own (etcd and three bookie processes): it stops every bookie."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from aiobk.bench.offload import force_gc
from aiobk.client import BookKeeper, LogPosition
from aiobk.metadata import EtcdProcess, OffloadStoreSettings
from tests.support.procs import BookieProcess

LOG = "offloaded"
RECORDS = 400


async def write_log(uri: str) -> list[int]:
    """RECORDS envelope records (keys and headers set) over several small ledgers."""
    async with await BookKeeper.connect(uri) as bk:
        writer = await bk.open_log_writer(LOG, roll_bytes=4000)
        for i in range(RECORDS):
            await writer.append(
                b"record-%04d" % i * 8, key=b"k%d" % (i % 7), headers={"n": b"%d" % i}
            )
        await writer.close()
        return list((await bk.store.read_log(LOG)).ledgers)


async def offload_before(uri: str, store: Path, ledger_id: int) -> list[str]:
    async with await BookKeeper.connect(uri) as bk:
        await bk.store.set_offload_store(OffloadStoreSettings(f"file://{store}", deletion_lag=0))
        report = await bk.offload_log(LOG, before=LogPosition(ledger_id, 0))
        return [ledger.outcome for ledger in report.ledgers]


def rows_of(spark: Any, uri: str, **options: str) -> list[tuple[Any, ...]]:
    reader = spark.read.format("aiobk").option("metadata", uri).option("log", LOG)
    for name, value in options.items():
        reader = reader.option(name, value)
    rows = reader.option("split", "70").load().collect()
    return sorted(
        (r.ledger_id, r.entry_id, bytes(r.data), r.key, sorted(r.headers.items()), r.timestamp,
         r.position, r.producer_id, r.sequence)
        for r in rows
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_spark_reads_released_ledgers_from_the_store_alone(spark: Any, tmp_path: Path) -> None:
    etcd = EtcdProcess(data_dir=str(tmp_path / "etcd")).start()
    uri = etcd.uri("spark-offload")
    bookies = [BookieProcess(tmp_path / f"bookie{i}", None, "--metadata", uri) for i in range(3)]
    store = tmp_path / "store"
    store.mkdir()
    try:

        async def start() -> None:
            await asyncio.gather(*(b.start() for b in bookies))

        asyncio.run(start())
        ledgers = asyncio.run(write_log(uri))
        assert len(ledgers) >= 4
        before = rows_of(spark, uri)
        assert len(before) == RECORDS

        kept = ledgers[len(ledgers) // 2]
        outcomes = asyncio.run(offload_before(uri, store, kept))
        assert outcomes == ["released"] * (len(ledgers) // 2)

        async def gc_all() -> int:
            done = await asyncio.gather(*(force_gc(b.port) for b in bookies))
            return sum(r.bytes_freed + r.ledgers_deleted + r.logs_removed for r in done)

        asyncio.run(gc_all())
        assert rows_of(spark, uri) == before

        for bookie in bookies:
            bookie.stop()
        ending = json.dumps({LOG: f"{kept}:0"})
        offloaded = [row for row in before if row[0] < kept]
        assert rows_of(spark, uri, endingPosition=ending) == offloaded
        by_id = spark.read.format("aiobk").option("metadata", uri)
        raw = by_id.option("ledgers", str(ledgers[0])).load().collect()
        assert len(raw) == sum(1 for row in before if row[0] == ledgers[0])

        (damaged, *_) = sorted(store.rglob("*.aobk"))
        data = bytearray(damaged.read_bytes())
        data[200] ^= 0xFF  # inside the first block's bodies
        damaged.write_bytes(bytes(data))
        with pytest.raises(Exception, match=r"MalformedObjectError|DigestMismatchError") as info:
            rows_of(spark, uri, endingPosition=ending)
        assert "CRC" in str(info.value) or "digest" in str(info.value)
    finally:
        for bookie in bookies:
            bookie.stop()
        etcd.stop()
