"""Spark data source throughput next to a plain client doing the same work.

Starts etcd and three bookies as processes on loopback (data on the project's disk), then, for
N records of S bytes (default 100,000 x 1 KiB):

\b
- client write: one log writer, appends pipelined (512 in flight);
- Spark write: a DataFrame of the same records in 4 partitions, ``df.write.format("aiobk")``;
- client read: one reader over the log, ledgers read in ranges;
- Spark read: ``spark.read.format("aiobk")`` summing the payload lengths (every row is read);
- Spark stream: the same log read as a stream in micro-batches of 10,000 records
  (``maxRecordsPerTrigger``, ``Trigger.AvailableNow``, the no-op sink): median batch rows/s.

Rows/s for each, and the Spark/client ratio (targets: write and read >= 0.9x the client's).
The client's clock starts after it connected; Spark's after the session ran one small job
(``WARMUP`` records written to another log and read back), which starts the JVM's Python
worker daemons and looks the data source up once per application -- about 10 s here, that
first job's time printed beside the table (a long-running Spark application pays it once; a
job run alone in its own application pays it every time).
python -m aiobk.bench.spark --records 100000.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from aiobk.bench.cluster import start_bookies, stop_bookies
from aiobk.bench.targets import module_main, write_report
from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess

STREAM_BATCH = 10_000  # maxRecordsPerTrigger of the streaming figure
WARMUP = 1_000  # records of the session's first job, before any clock
TARGET = 0.9  # Spark should write and read at least this share of the client's rows/s


async def client_write(
    uri: str, log: str, records: int, size: int, roll_bytes: int | None = None
) -> float:
    """Rows/s of ``records`` of ``size`` bytes appended through a log writer, 512 in flight
    (its ledgers rolling at ``roll_bytes``, or the writer's default)."""
    payload = b"x" * size
    async with await BookKeeper.connect(uri) as bk:
        if roll_bytes is None:
            writer = await bk.open_log_writer(log)
        else:
            writer = await bk.open_log_writer(log, roll_bytes=roll_bytes)
        started = time.perf_counter()
        window: list[asyncio.Future[object]] = []
        for i in range(records):
            window.append(asyncio.ensure_future(writer.append(payload)))
            if len(window) >= 512 or i == records - 1:
                await asyncio.gather(*window)
                window.clear()
        await writer.close()
        return records / (time.perf_counter() - started)


async def client_read(uri: str, log: str, records: int) -> float:
    async with await BookKeeper.connect(uri) as bk:
        started = time.perf_counter()
        count = 0
        for ledger_id in (await bk.store.read_log(log)).ledgers:
            handle = await bk.open_ledger(ledger_id, recovery=False)
            last = handle.last_add_confirmed
            for lo in range(0, last + 1, 1000):
                count += len(await handle.read(lo, min(last, lo + 999)))
        assert count == records, (count, records)
        return records / (time.perf_counter() - started)


def records_frame(spark: Any, count: int, size: int) -> Any:
    """A DataFrame of ``count`` rows of ``size`` bytes in a ``data`` column, 4 partitions."""
    from pyspark.sql import functions as F

    return spark.range(count, numPartitions=4).select(
        F.expr(f"cast(repeat('x', {size}) as binary)").alias("data")
    )


def warm_up(spark: Any, uri: str, size: int) -> dict[str, float]:
    """The session's first write and read jobs (``WARMUP`` records, log "warmup"): seconds."""
    df = records_frame(spark, WARMUP, size)
    started = time.perf_counter()
    df.write.format("aiobk").option("metadata", uri).option("log", "warmup").mode("append").save()
    wrote = time.perf_counter()
    count = spark.read.format("aiobk").option("metadata", uri).option("log", "warmup").load()
    assert count.count() == WARMUP
    return {"first write job s": wrote - started, "first read job s": time.perf_counter() - wrote}


def warm_read(spark: Any, uri: str) -> None:
    """A new context's first read job (the log ``warm_up`` wrote), before any clock."""
    count = spark.read.format("aiobk").option("metadata", uri).option("log", "warmup").load()
    assert count.count() == WARMUP


def stream_rate(spark: Any, uri: str, base: str, records: int) -> float:
    """A streaming read of the Spark-written log in micro-batches of 10,000 records
    (``maxRecordsPerTrigger``, ``Trigger.AvailableNow``, the no-op sink): the median of the
    batches' rows/s after the first (steady state: the first pays for the query's start)."""
    query = (
        spark.readStream.format("aiobk")
        .option("metadata", uri)
        .option("log", "spark")
        .option("maxRecordsPerTrigger", str(STREAM_BATCH))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", os.path.join(base, "stream-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert sum(p["numInputRows"] for p in batches) == records
    rates = sorted(p["processedRowsPerSecond"] for p in batches[1:]) or [0.0]
    return float(rates[len(rates) // 2])


@click.command("spark", help=__doc__, short_help="The Spark data source next to a plain client.")
@click.option(
    "--records", type=click.IntRange(1), default=100_000, show_default=True,
    help="Records written and read.",
)  # fmt: skip
@click.option("--size", type=click.IntRange(1), default=1024, show_default=True, help="Bytes.")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), default=None,
    help="Also write the figures to this file.",
)  # fmt: skip
def command(records: int, size: int, json_path: str | None) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F

    from aiobk.pipeline import local_session

    base = tempfile.mkdtemp(prefix="aiobk-bench-spark-", dir=os.getcwd())
    etcd = EtcdProcess(data_dir=os.path.join(base, "etcd")).start()
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, float] = {}
    try:
        uri = etcd.uri("bench-spark")
        procs = start_bookies(3, base, uri)
        results["client write"] = asyncio.run(client_write(uri, "plain", records, size))
        results["client read"] = asyncio.run(client_read(uri, "plain", records))
        spark = local_session("aiobk-bench")
        try:
            df = records_frame(spark, records, size)
            df.cache().count()  # generated before the clock starts
            cold = warm_up(spark, uri, size)
            started = time.perf_counter()
            df.write.format("aiobk").option("metadata", uri).option("log", "spark").mode(
                "append"
            ).save()
            results["Spark write"] = records / (time.perf_counter() - started)
            reader = spark.read.format("aiobk").option("metadata", uri).option("log", "spark")
            started = time.perf_counter()
            total = reader.option("split", "25000").load().agg(F.sum(F.length("data"))).first()
            results["Spark read"] = records / (time.perf_counter() - started)
            assert total is not None
            assert total[0] == records * size
            results["Spark stream"] = stream_rate(spark, uri, base, records)
        finally:
            spark.stop()
    finally:
        stop_bookies(procs)
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    table = Table(title=f"{records} records of {size} B, 3 bookies, local[2] Spark")
    for column in ("path", "rows/s", "vs client"):
        table.add_column(column, justify="right")
    for name in ("client write", "Spark write", "client read", "Spark read", "Spark stream"):
        plain = results["client " + ("read" if name == "Spark stream" else name.split()[1])]
        table.add_row(name, f"{results[name]:.0f}", f"{results[name] / plain:.2f}")
    for name, kind in (("Spark write", "write"), ("Spark read", "read")):
        ratio = results[name] / results["client " + kind]
        verdict = "met" if ratio >= TARGET else "MISSED"
        Console().print(f"target {name} >= {TARGET}x the client's: {ratio:.2f}x, {verdict}")
    Console().print(table)
    Console().print(
        f"the session's first jobs ({WARMUP:,} records, before the clocks): write "
        f"{cold['first write job s']:.1f} s, read {cold['first read job s']:.1f} s"
    )
    results.update(cold)
    if json_path:
        write_report("spark", results, json_path)
    return 0


main = module_main(command, "spark")


if __name__ == "__main__":
    main()
