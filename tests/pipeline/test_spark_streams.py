"""The Spark source on a local[2] session against a real cluster: streams over several logs chosen
by a pattern, from a time or a position, with logs that appear later; what the source refuses; and
the write columns' other shapes (a long time, binary keys, string headers, recordFormat)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from aiobk.client import ENVELOPE, BookKeeper
from aiobk.pipeline.options import Options
from aiobk.pipeline.write import TaskWritten, Writer, Written
from aiobk.protocol.errors import NoSuchLedgerError
from tests.pipeline.test_spark_records import source, write_timed

pytestmark = pytest.mark.timeout(600)


def stream(spark: Any, uri: str, out: Path, **options: str) -> list[Any]:
    """Run an AvailableNow query with ``options`` into a parquet directory (its checkpoint
    beside it); every row written there so far."""
    reader = spark.readStream.format("aiobk").option("metadata", uri)
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(out) + "-cp")
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240)
    assert query.exception() is None
    return list(spark.read.parquet(str(out)).collect())


def by_log(rows: list[Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r.log, []).append(int(bytes(r.data)))
    return {name: sorted(values) for name, values in sorted(out.items())}


def test_a_stream_reads_logs_by_pattern_from_a_time_and_takes_in_logs_that_appear(
    spark: Any, cluster_uri: str, tmp_path: Path
) -> None:
    write_timed(cluster_uri, "feed-a", ledgers=2, per_ledger=20)  # stamps 1000 .. 1390
    write_timed(cluster_uri, "feed-b", ledgers=1, per_ledger=30)  # 1000 .. 1290
    write_timed(cluster_uri, "other", ledgers=1, per_ledger=10)  # not matched
    out = tmp_path / "feeds"
    first = stream(spark, cluster_uri, out, logPattern="feed-.*", startingTimestamp="1200")
    assert by_log(first) == {
        "feed-a": list(range(1200, 1400, 10)),
        "feed-b": list(range(1200, 1300, 10)),
    }
    # Restarted from its checkpoint: new records of a known log, and a log that matches now,
    # read from its earliest record (the starting time is for the query's first offsets).
    write_timed(cluster_uri, "feed-a", ledgers=1, per_ledger=3)  # 1000 .. 1020 again
    write_timed(cluster_uri, "feed-c", ledgers=1, per_ledger=4)
    again = stream(spark, cluster_uri, out, logPattern="feed-.*", startingTimestamp="1200")
    assert by_log(again) == {
        "feed-a": sorted([*range(1200, 1400, 10), 1000, 1010, 1020]),
        "feed-b": list(range(1200, 1300, 10)),
        "feed-c": [1000, 1010, 1020, 1030],
    }


def test_a_stream_starts_at_a_position_per_log(
    spark: Any, cluster_uri: str, tmp_path: Path
) -> None:
    stamps = write_timed(cluster_uri, "pos-a", ledgers=2, per_ledger=10)
    write_timed(cluster_uri, "pos-b", ledgers=1, per_ledger=5)
    # pos-a from its 15th record (a position in its second ledger); pos-b, not named, earliest.
    start = json.dumps({"pos-a": str(stamps[15][0])})
    rows = stream(spark, cluster_uri, tmp_path / "pos", logs="pos-a,pos-b", startingPosition=start)
    assert by_log(rows) == {
        "pos-a": [s for _p, s in stamps[15:]],
        "pos-b": [1000, 1010, 1020, 1030, 1040],
    }
    latest = stream(spark, cluster_uri, tmp_path / "latest", log="pos-a", startingPosition="latest")
    assert latest == []
    # minRecordsPerTrigger with maxTriggerDelay through Spark: under AvailableNow the minimum
    # holds nothing back (it once held these 5 records back, and the query ended with none).
    held = stream(
        spark, cluster_uri, tmp_path / "min", log="pos-b", minRecordsPerTrigger="1000",
        maxTriggerDelay="1h",
    )  # fmt: skip
    assert by_log(held) == {"pos-b": [1000, 1010, 1020, 1030, 1040]}


def test_what_the_source_refuses(spark: Any, cluster_uri: str, tmp_path: Path) -> None:
    write_timed(cluster_uri, "refused", ledgers=1, per_ledger=2)
    with pytest.raises(Exception, match="streaming reads need 'log', 'logs' or 'logPattern'"):
        stream(spark, cluster_uri, tmp_path / "a", ledgers="1")
    with pytest.raises(Exception, match="'endingPosition' and 'endingTimestamp' are for batch"):
        stream(spark, cluster_uri, tmp_path / "b", log="refused", endingPosition="latest")
    df = spark.createDataFrame([(b"x",)], "data binary")
    with pytest.raises(Exception, match="only appends"):
        df.write.format("aiobk").option("metadata", cluster_uri).option("log", "refused").mode(
            "overwrite"
        ).save()
    with pytest.raises(Exception, match="writes take one"):
        df.write.format("aiobk").option("metadata", cluster_uri).option("logPattern", "ref.*").mode(
            "append"
        ).save()
    sink = (
        spark.readStream.format("aiobk")
        .option("metadata", cluster_uri)
        .option("log", "refused")
        .load()
        .select("data")
        .writeStream.format("aiobk")
        .option("metadata", cluster_uri)
        .option("log", "refused")
        .option("checkpointLocation", str(tmp_path / "sink-cp"))
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="no streaming sink: write each micro-batch with"):
        sink.start().awaitTermination(120)
    assert source(spark, cluster_uri, log="refused").count() == 2  # nothing written


def test_write_columns_in_their_other_shapes(spark: Any, cluster_uri: str) -> None:
    # A long of ms for the time, a binary key, headers of strings.
    rows = [(1_700_000_000_123 + i, bytes([i, 0, 255]), {"h": f"v{i}"}, f"d{i}".encode())
            for i in range(5)]  # fmt: skip
    schema = "timestamp long, key binary, headers map<string,string>, data binary"
    spark.createDataFrame(rows, schema).write.format("aiobk").option(
        "metadata", cluster_uri
    ).option("log", "shapes").mode("append").save()
    got = {bytes(r.data): r for r in source(spark, cluster_uri, log="shapes").collect()}
    for i in range(5):
        r = got[f"d{i}".encode()]
        assert round(r.timestamp.timestamp() * 1000) == 1_700_000_000_123 + i
        assert bytes(r.key) == bytes([i, 0, 255])
        assert {k: bytes(v) for k, v in r.headers.items()} == {"h": f"v{i}".encode()}
    # recordFormat: a job without record columns creates an envelope log by default (stamped
    # by the task's clock, no key), or a raw one when asked.
    plain = spark.createDataFrame([(b"p",)], "data binary")
    for log, fmt in (("made-envelope", None), ("made-raw", "raw")):
        writer = plain.write.format("aiobk").option("metadata", cluster_uri).option("log", log)
        if fmt is not None:
            writer = writer.option("recordFormat", fmt)
        writer.mode("append").save()
    (envelope,) = source(spark, cluster_uri, log="made-envelope").collect()
    assert envelope.key is None
    assert envelope.timestamp is not None
    (raw,) = source(spark, cluster_uri, log="made-raw").collect()
    assert raw.timestamp is None
    assert bytes(raw.data) == b"p"


def test_a_commit_failing_midway_says_which_logs_it_published(cluster_uri: str) -> None:
    """Logs are published one by one in name order: a failure at the second leaves the first
    published, says so, and deletes the job's ledger that was not published."""
    schema = StructType([StructField("data", BinaryType()), StructField("log", StringType())])
    writer = Writer(Options.parse({"metadata": cluster_uri}, writing=True), schema)

    async def ledgers() -> list[int]:
        ids = []
        async with await BookKeeper.connect(cluster_uri) as bk:
            await bk.store.create_log("mid-b", ENVELOPE)  # the job's ledger for it is raw
            for _ in range(2):
                tag = {"spark_job": writer.job.encode()}
                async with await bk.create_ledger(custom_metadata=tag) as handle:
                    await handle.append(b"row")
                    ids.append(handle.ledger_id)
        return ids

    first, second = asyncio.run(ledgers())
    done = [TaskWritten(0, [Written(0, first, 1, "mid-a"), Written(0, second, 1, "mid-b")])]
    with pytest.raises(RuntimeError, match=r"published to \['mid-a'\], then failed: .*envelope"):
        writer.commit(list(done))

    async def after() -> tuple[tuple[int, ...], tuple[int, ...], bool]:
        async with await BookKeeper.connect(cluster_uri) as bk:
            a = (await bk.store.read_log("mid-a")).ledgers
            b = (await bk.store.read_log("mid-b")).ledgers
            try:
                await bk.store.read_ledger(second)
            except NoSuchLedgerError:
                return tuple(a), tuple(b), True
            return tuple(a), tuple(b), False

    assert asyncio.run(after()) == ((first,), (), True)
