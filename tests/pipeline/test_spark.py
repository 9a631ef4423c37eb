"""The ``aiobk`` Spark data source on a local[2] session against a real cluster (etcd and three
bookie processes: Spark's Python workers are separate processes and connect over loopback)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookKeeper
from aiobk.pipeline.source import SCHEMA

pytestmark = pytest.mark.timeout(600)


def append(uri: str, log: str, values: list[bytes]) -> None:
    async def run() -> None:
        async with await BookKeeper.connect(uri) as bk:
            writer = await bk.open_log_writer(log)
            await asyncio.gather(*(writer.append(v) for v in values))
            await writer.close()

    asyncio.run(run())


def test_batch_write_then_read_10000_records(spark: Any, cluster_uri: str) -> None:
    values = [f"event-{i:05d}".encode() for i in range(10_000)]
    df = spark.createDataFrame([(v,) for v in values], "data binary").repartition(4)
    df.write.format("aiobk").option("metadata", cluster_uri).option("log", "batch").mode(
        "append"
    ).save()
    read = spark.read.format("aiobk").option("metadata", cluster_uri).option("log", "batch")
    out = read.option("split", "1500").load()
    assert out.columns == [
        "log", "ledger_id", "entry_id", "data", "key", "headers", "timestamp", "position",
        "producer_id", "sequence",
    ]  # fmt: skip
    rows = out.collect()
    assert len(rows) == 10_000
    assert sorted(bytes(r.data) for r in rows) == values
    assert {r.log for r in rows} == {"batch"}
    # No record columns: envelope records (the default for a new log), stamped when written.
    assert {(r.key, len(r.headers), r.producer_id, r.sequence) for r in rows} == {
        (None, 0, None, None)
    }  # plain records: no producer
    assert all(r.timestamp is not None for r in rows)
    assert all(r.position == f"{r.ledger_id}:{r.entry_id}" for r in rows)
    assert len({(r.ledger_id, r.entry_id) for r in rows}) == 10_000
    assert len({r.ledger_id for r in rows}) == 4  # one ledger per written partition
    one = rows[0].ledger_id
    by_id = spark.read.format("aiobk").option("metadata", cluster_uri).option("ledgers", str(one))
    assert by_id.load().count() == sum(1 for r in rows if r.ledger_id == one)


def test_a_failed_write_job_leaves_no_ledger_behind(spark: Any, cluster_uri: str) -> None:
    from pyspark.sql import functions as f

    bad = f.when(f.col("id") == 3000, f.raise_error(f.lit("row 3000 is bad")))
    data = bad.otherwise(f.concat(f.lit("v"), f.col("id").cast("string"))).cast("binary")
    df = spark.range(4000).repartition(2).select(data.alias("data"))
    writer = df.write.format("aiobk").option("metadata", cluster_uri).option("log", "failing")
    with pytest.raises(Exception, match="row 3000 is bad"):
        writer.mode("append").save()

    async def leftovers() -> list[int]:
        async with await BookKeeper.connect(cluster_uri) as bk:
            found = []
            async for ledger_id in bk.list_ledgers():
                metadata = await bk.store.read_ledger(ledger_id)
                if metadata.custom_metadata.get("log") == b"failing":
                    found.append(ledger_id)
            return found

    assert asyncio.run(leftovers()) == []  # the good partition's ledger went with the abort


def _wait_for(spark: Any, path: Path, count: int, timeout: float = 180.0) -> int:
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        if any(path.glob("*.parquet")):
            seen = int(spark.read.schema(SCHEMA).parquet(str(path)).count())
            if seen >= count:
                return seen
        time.sleep(1.0)
    return seen


def test_streaming_is_exactly_once_across_a_restart(
    spark: Any, cluster_uri: str, tmp_path: Path
) -> None:
    first = [b"s-%04d" % i for i in range(300)]
    append(cluster_uri, "stream", first)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start() -> Any:
        stream = (
            spark.readStream.format("aiobk")
            .option("metadata", cluster_uri)
            .option("log", "stream")
            .load()
        )
        return (
            stream.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="1 second")
            .start()
        )

    query = start()
    try:
        assert _wait_for(spark, out, 300) >= 300
        live = [b"s-%04d" % i for i in range(300, 500)]
        append(cluster_uri, "stream", live)  # while the query runs
        assert _wait_for(spark, out, 500) == 500
    finally:
        query.stop()
    later = [b"s-%04d" % i for i in range(500, 650)]
    append(cluster_uri, "stream", later)  # while it is stopped
    query = start()  # from the checkpoint
    try:
        assert _wait_for(spark, out, 650) == 650
        time.sleep(3)  # a few more triggers: nothing may be repeated
    finally:
        query.stop()
    rows = spark.read.schema(SCHEMA).parquet(str(out)).collect()
    assert sorted(bytes(r.data) for r in rows) == first + live + later
    assert len({(r.ledger_id, r.entry_id) for r in rows}) == 650
