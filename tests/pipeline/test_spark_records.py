"""The Spark source's records (key, headers, time, producer and sequence), its choice of logs,
positions and times, data loss, partitions and admission control, on a local[2] session against
a real cluster (tests/pipeline/conftest.py)."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from aiobk.client import ENVELOPE, BookKeeper, LogPosition
from aiobk.pipeline.options import Options
from aiobk.pipeline.positions import DataLossError, LedgerRange
from aiobk.pipeline.stream import StreamReader

pytestmark = pytest.mark.timeout(600)
UTC = datetime.UTC


def source(spark: Any, uri: str, **options: str) -> Any:
    reader = spark.read.format("aiobk").option("metadata", uri)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def write_timed(uri: str, log: str, ledgers: int, per_ledger: int) -> list[tuple[LogPosition, int]]:
    """``ledgers`` ledgers of envelope records stamped 1000, 1010, ... ms; (position, stamp)."""

    async def run() -> list[tuple[LogPosition, int]]:
        out = []
        async with await BookKeeper.connect(uri) as bk:
            for ledger in range(ledgers):
                async with await bk.open_log_writer(log, record_format=ENVELOPE) as writer:
                    for i in range(per_ledger):
                        stamp = 1000 + 10 * (ledger * per_ledger + i)
                        out.append((await writer.append(b"%d" % stamp, timestamp=stamp), stamp))
        return out

    return asyncio.run(run())


def epoch_ms(value: datetime.datetime) -> int:
    return round(value.timestamp() * 1000)  # collect() gives the session's local time


def test_records_with_keys_headers_and_times_routed_to_logs(spark: Any, cluster_uri: str) -> None:
    base = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        (f"k{i % 3}", {"n": str(i).encode()}, base + datetime.timedelta(seconds=i),
         f"d{i}".encode(), "east" if i % 2 else "west")
        for i in range(200)
    ]  # fmt: skip
    schema = "key string, headers map<string,binary>, timestamp timestamp, data binary, log string"
    df = spark.createDataFrame(rows, schema).repartition(3)
    df.write.format("aiobk").option("metadata", cluster_uri).mode("append").save()

    out = source(spark, cluster_uri, logs="east,west")
    assert out.columns == [
        "log", "ledger_id", "entry_id", "data", "key", "headers", "timestamp", "position",
        "producer_id", "sequence",
    ]  # fmt: skip
    got = {bytes(r.data): r for r in out.collect()}
    assert len(got) == 200
    for i in range(200):
        r = got[f"d{i}".encode()]
        assert r.log == ("east" if i % 2 else "west")
        assert bytes(r.key) == f"k{i % 3}".encode()
        assert {k: bytes(v) for k, v in r.headers.items()} == {"n": str(i).encode()}
        assert epoch_ms(r.timestamp) == epoch_ms(base) + 1000 * i
        assert r.position == f"{r.ledger_id}:{r.entry_id}"
    # The job created both logs with envelope records (it has key/headers/timestamp columns).
    assert source(spark, cluster_uri, logPattern="(ea|we)st").count() == 200
    assert source(spark, cluster_uri, logPattern="ea.*").count() == 100

    # Rows without a time are stamped with the task's clock; rows with no log and no
    # option are refused; a raw log refuses keys.
    before = time.time() * 1000
    spark.createDataFrame([(b"now", "east")], "data binary, log string").write.format(
        "aiobk"
    ).option("metadata", cluster_uri).mode("append").save()
    (now,) = source(spark, cluster_uri, log="east").where("data = X'6E6F77'").collect()
    assert before - 1000 <= epoch_ms(now.timestamp) <= time.time() * 1000 + 1000
    with pytest.raises(Exception, match="a row has no log"):
        spark.createDataFrame([(b"x", None)], "data binary, log string").write.format(
            "aiobk"
        ).option("metadata", cluster_uri).mode("append").save()
    spark.createDataFrame([(b"r",)], "data binary").write.format("aiobk").option(
        "metadata", cluster_uri
    ).option("log", "rawlog").option("recordFormat", "raw").mode("append").save()
    with pytest.raises(Exception, match="holds raw records"):
        spark.createDataFrame([(b"x", "k")], "data binary, key string").write.format(
            "aiobk"
        ).option("metadata", cluster_uri).option("log", "rawlog").mode("append").save()
    assert [bytes(r.data) for r in source(spark, cluster_uri, log="rawlog").collect()] == [b"r"]


def write_produced(uri: str) -> list[tuple[str | None, int | None]]:
    """The log ``produced``: producer ``svc`` appends 0-9, a plain writer 3 records, producer
    ``other`` 100 and 105 (a gap); (producer_id, sequence) of each record, in log order."""

    async def run() -> None:
        async with await BookKeeper.connect(uri) as bk:
            async with await bk.open_log_writer("produced", producer_id="svc") as svc:
                for i in range(10):
                    await svc.append(b"svc %d" % i)
                assert await svc.append(b"again", sequence=4) is None  # not appended again
            async with await bk.open_log_writer("produced") as plain:
                for i in range(3):
                    await plain.append(b"plain %d" % i)
            async with await bk.open_log_writer("produced", producer_id="other") as other:
                await other.append(b"other", sequence=100)
                await other.append(b"other", sequence=105)

    asyncio.run(run())
    return [
        *(("svc", i) for i in range(10)), *((None, None) for _ in range(3)),
        ("other", 100), ("other", 105),
    ]  # fmt: skip


def test_producer_and_sequence_columns_in_batch_and_streaming_reads(
    spark: Any, cluster_uri: str, tmp_path: Path
) -> None:
    from pyspark.sql.types import LongType, StringType

    expected = write_produced(cluster_uri)

    def in_order(rows: list[Any]) -> list[tuple[str | None, int | None]]:
        ordered = sorted(rows, key=lambda r: (r.ledger_id, r.entry_id))
        return [(r.producer_id, r.sequence) for r in ordered]

    batch = source(spark, cluster_uri, log="produced")
    fields = {f.name: f for f in batch.schema.fields}
    assert (fields["producer_id"].dataType, fields["producer_id"].nullable) == (StringType(), True)
    assert (fields["sequence"].dataType, fields["sequence"].nullable) == (LongType(), True)
    assert in_order(batch.collect()) == expected
    query = (
        spark.readStream.format("aiobk").option("metadata", cluster_uri).option("log", "produced")
        .load().writeStream.format("parquet").option("path", str(tmp_path / "produced"))
        .option("checkpointLocation", str(tmp_path / "produced-cp"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    assert query.awaitTermination(240)
    assert query.exception() is None
    assert in_order(spark.read.parquet(str(tmp_path / "produced")).collect()) == expected

    # Plain records read nulls: an envelope log no producer wrote, a raw log, ledgers by id,
    # and a copy the Spark sink wrote (it ignores the two columns, and appends plain records).
    plain_rows = [(b"p%d" % i,) for i in range(5)]
    spark.createDataFrame(plain_rows, "data binary").write.format("aiobk").option(
        "metadata", cluster_uri
    ).option("log", "unproduced").mode("append").save()
    spark.createDataFrame(plain_rows, "data binary").write.format("aiobk").option(
        "metadata", cluster_uri
    ).option("log", "unproduced-raw").option("recordFormat", "raw").mode("append").save()
    batch.select("data", "producer_id", "sequence").write.format("aiobk").option(
        "metadata", cluster_uri
    ).option("log", "produced-copy").mode("append").save()
    ledger = batch.first().ledger_id
    for options in ({"log": "unproduced"}, {"log": "unproduced-raw"},
                    {"log": "produced-copy"}, {"ledgers": str(ledger)}):  # fmt: skip
        rows = source(spark, cluster_uri, **options).collect()
        assert rows, options
        assert {(r.producer_id, r.sequence) for r in rows} == {(None, None)}, options
    streamed = (
        spark.readStream.format("aiobk").option("metadata", cluster_uri)
        .option("log", "unproduced").load().writeStream.format("parquet")
        .option("path", str(tmp_path / "unproduced"))
        .option("checkpointLocation", str(tmp_path / "unproduced-cp"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    assert streamed.awaitTermination(240)
    rows = spark.read.parquet(str(tmp_path / "unproduced")).collect()
    assert len(rows) == 5
    assert {(r.producer_id, r.sequence) for r in rows} == {(None, None)}


def test_positions_times_partitions_and_data_loss(spark: Any, cluster_uri: str) -> None:
    stamps = write_timed(cluster_uri, "timed", ledgers=3, per_ledger=100)
    pos = [p for p, _s in stamps]

    def data(df: Any) -> list[int]:
        return sorted(int(bytes(r.data)) for r in df.collect())

    everything = [s for _p, s in stamps]
    assert data(source(spark, cluster_uri, log="timed")) == everything
    # Times: the first record at or after startingTimestamp, up to endingTimestamp (exclusive).
    assert data(source(spark, cluster_uri, log="timed", startingTimestamp="1505")) == [
        s for s in everything if s >= 1505
    ]
    assert data(
        source(spark, cluster_uri, log="timed", startingTimestamp="2000", endingTimestamp="3500")
    ) == [s for s in everything if 2000 <= s < 3500]
    assert source(spark, cluster_uri, log="timed", startingTimestamp="999999").count() == 0
    # Positions: JSON per log, and earliest / latest.
    start = json.dumps({"timed": str(pos[50])})
    end = json.dumps({"timed": {"ledger": pos[250].ledger_id, "entry": pos[250].entry_id}})
    window = source(spark, cluster_uri, log="timed", startingPosition=start, endingPosition=end)
    assert data(window) == everything[50:250]
    assert source(spark, cluster_uri, log="timed", startingPosition="latest").count() == 0
    assert source(spark, cluster_uri, log="timed", endingPosition="earliest").count() == 0
    # Partitions: split and minPartitions cut ledgers into ranges.
    assert source(spark, cluster_uri, log="timed").rdd.getNumPartitions() == 3
    assert source(spark, cluster_uri, log="timed", minPartitions="10").rdd.getNumPartitions() >= 10
    assert source(spark, cluster_uri, log="timed", split="40").rdd.getNumPartitions() == 9

    # Data loss: the first ledger is truncated away under a start inside it.
    async def truncate() -> None:
        async with await BookKeeper.connect(cluster_uri) as bk:
            await bk.truncate_log("timed", before=pos[100])

    asyncio.run(truncate())
    inside = json.dumps({"timed": str(pos[5])})
    with pytest.raises(Exception, match="truncated away before they were read"):
        source(spark, cluster_uri, log="timed", startingPosition=inside).count()
    skipped = source(
        spark, cluster_uri, log="timed", startingPosition=inside, failOnDataLoss="false"
    )
    assert data(skipped) == everything[100:]


def test_streams_in_bounded_batches_and_available_now_stops(
    spark: Any, cluster_uri: str, tmp_path: Path
) -> None:
    write_timed(cluster_uri, "bounded", ledgers=2, per_ledger=225)

    def run(name: str, **options: str) -> list[int]:
        stream = spark.readStream.format("aiobk").option("metadata", cluster_uri)
        stream = stream.option("log", "bounded")
        for key, value in options.items():
            stream = stream.option(key, value)
        query = (
            stream.load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / name))
            .option("checkpointLocation", str(tmp_path / f"{name}-cp"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(240)  # AvailableNow ends by itself
        rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert spark.read.parquet(str(tmp_path / name)).count() == 450
        return rows

    assert run("records", maxRecordsPerTrigger="100") == [100, 100, 100, 100, 50]
    # Each record is 15 bytes of envelope and 4 of data: 1,900 bytes are about 100 records.
    by_bytes = run("bytes", maxBytesPerTrigger="1900")
    assert len(by_bytes) >= 4
    assert max(by_bytes) <= 110
    assert run("all") == [450]


def test_min_records_wait_for_max_trigger_delay(
    cluster_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Admission on the driver (what Spark asks of the source between batches)."""
    write_timed(cluster_uri, "trickle", ledgers=1, per_ledger=50)
    opts = Options.parse(
        {"metadata": cluster_uri, "log": "trickle", "minRecordsPerTrigger": "100",
         "maxTriggerDelay": "2s"}
    )  # fmt: skip
    reader = StreamReader(opts)
    assert reader.getDefaultReadLimit() == ReadMinRows(100)
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMinRows(100))  # the first batch never waits
    assert count(reader, start, first) == 50
    write_timed(cluster_uri, "trickle", ledgers=1, per_ledger=50)
    held = reader.latestOffset(first, ReadMinRows(100))  # 50 < 100: wait
    assert count(reader, first, held) == 0
    full = reader.latestOffset(first, ReadAllAvailable())  # the engine's "everything"
    assert count(reader, first, full) == 50
    time.sleep(2.2)
    assert reader.latestOffset(first, ReadMinRows(100)) == full  # the delay passed

    # A checkpointed offset inside a truncated ledger: DataLossError, or a skip said in the log.
    write_timed(cluster_uri, "trickle", ledgers=1, per_ledger=10)

    async def truncate() -> list[int]:
        async with await BookKeeper.connect(cluster_uri) as bk:
            ledgers = (await bk.store.read_log("trickle")).ledgers
            await bk.truncate_log("trickle", before=LogPosition(ledgers[-1], 0))
            return list(ledgers)

    ledgers = asyncio.run(truncate())
    lost = {"logs": {"trickle": {"ledger": ledgers[0], "entry": 20}}}
    with pytest.raises(DataLossError, match="truncated away"):
        reader.latestOffset(lost, ReadAllAvailable())
    lenient = StreamReader(Options.parse({**opts_dict(cluster_uri), "failOnDataLoss": "false"}))
    with caplog.at_level(logging.WARNING, logger="aiobk.pipeline.positions"):
        skipped = lenient.latestOffset(lost, ReadAllAvailable())
    assert skipped == {"logs": {"trickle": {"ledger": ledgers[-1], "entry": 10}}}
    assert [p.ledger_id for p in ranges(lenient, lost, skipped)] == [ledgers[-1]]
    said = f"up to {LogPosition(ledgers[-1], 0)} were truncated away before they were read"
    assert said in caplog.text
    assert "skipping to" in caplog.text


def test_available_now_reads_what_was_there_and_no_minimum_holds_it_back(
    cluster_uri: str,
) -> None:
    """Trigger.AvailableNow on the driver: batches end where the log ended when the query
    started (records appended later wait for the next query), and the last batch, smaller than
    ``minRecordsPerTrigger``, is not held back for ``maxTriggerDelay``; without AvailableNow it
    is."""
    write_timed(cluster_uri, "cutoff", ledgers=1, per_ledger=30)
    options = {"metadata": cluster_uri, "log": "cutoff", "maxRecordsPerTrigger": "10",
               "minRecordsPerTrigger": "15", "maxTriggerDelay": "1h"}  # fmt: skip
    now = StreamReader(Options.parse(options))
    start = now.initialOffset()
    now.prepareForTriggerAvailableNow()
    write_timed(cluster_uri, "cutoff", ledgers=1, per_ledger=20)  # after the query started
    assert batches(now, start) == [10, 10, 10]
    streaming = StreamReader(Options.parse(options))
    # 50 records: batches of 10 while 15 or more wait, then the last 10 wait for the delay.
    assert batches(streaming, start) == [10, 10, 10, 10]


def batches(reader: StreamReader, offset: dict[str, Any]) -> list[int]:
    """The records of each batch the reader admits from ``offset`` until it admits none."""
    sizes = []
    for _ in range(20):
        end = reader.latestOffset(offset, ReadMaxRows(10))
        if end == offset:
            break
        sizes.append(count(reader, offset, end))
        offset = end
    return sizes


def ranges(reader: StreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[LedgerRange]:
    parts = reader.partitions(start, end)
    assert all(isinstance(part, LedgerRange) for part in parts)
    return [part for part in parts if isinstance(part, LedgerRange)]


def count(reader: StreamReader, start: dict[str, Any], end: dict[str, Any]) -> int:
    return sum(part.count for part in ranges(reader, start, end))


def opts_dict(uri: str) -> dict[str, str]:
    return {"metadata": uri, "log": "trickle"}
