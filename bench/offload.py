"""Offloading a log to an object store, and Spark reading it back from there.

Starts etcd and three bookies as processes on loopback (data on the project's disk), writes
N records of S bytes (default 200,000 x 1 KiB) to a log that rolls every 16 MiB and closes
the writer, then:

\b
- Spark read from the bookies: ``spark.read.format("aiobk")`` summing payload lengths; the
  Spark context is stopped then (an offloader does not run beside a Spark job) and a new one
  started for the store's read;
- offload: a file:// store on the same disk with deletion lag 0, ``bk.offload_log(name)``
  timed; MB/s is the objects' bytes over that time, beside the sequential copy floor of the
  same disk measured in the same run (8 MiB chunks, each fdatasynced);
- a garbage collection pass forced on every bookie, so they really dropped the ledgers, then
  every bookie stopped;
- Spark read again, now from the store (each task reads its objects itself, no bookie runs).

Targets, ratios of the same run: Spark rows/s from the store >= 2x from the bookies; offload
MB/s >= 0.5x the copy floor. Each Spark context runs one small job first (``warm_up``,
``warm_read``), before any clock. python -m aiobk.bench.offload --records 200000.
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

from aiobk.bench.cluster import start_bookie, stop_bookies
from aiobk.bench.floors import copy_floor, make_copy_source
from aiobk.bench.spark import client_write, warm_read, warm_up
from aiobk.bench.targets import (
    fail_on_miss_option,
    json_option,
    module_main,
    report_checks,
    write_report,
)
from aiobk.client import BookieConnection, BookKeeper
from aiobk.metadata import EtcdProcess, OffloadStoreSettings
from aiobk.protocol import GcRequest, GcResponse, StatusCode

LOG = "offload"
ROLL_BYTES = 16 * 1024 * 1024  # the log's ledgers: one object each
FLOOR_CHUNK = 8 * 1024 * 1024
SPARK_TARGET = 2.0  # Spark from the store vs from the bookies
OFFLOAD_TARGET = 0.5  # offload MB/s vs the copy floor
MB = 1_000_000


async def write_log(uri: str, records: int, size: int) -> float:
    """``records`` of ``size`` bytes appended pipelined (512 in flight); seconds."""
    return records / await client_write(uri, LOG, records, size, ROLL_BYTES)


async def offload(uri: str, store_url: str) -> tuple[float, int, int]:
    """The store set (deletion lag 0), then ``offload_log`` timed: (seconds, object bytes,
    ledgers released)."""
    async with await BookKeeper.connect(uri) as bk:
        await bk.store.set_offload_store(OffloadStoreSettings(store_url, deletion_lag=0))
        started = time.perf_counter()
        report = await bk.offload_log(LOG)
        elapsed = time.perf_counter() - started
        released = sum(1 for ledger in report.ledgers if ledger.outcome == "released")
        return elapsed, report.bytes, released


async def force_gc(port: int, host: str = "127.0.0.1", timeout: float = 120.0) -> GcResponse:
    """One garbage collection pass on the bookie at ``host:port``, run now."""
    conn = await BookieConnection.open(host, port, timeout=10.0)
    try:
        response = await conn.send(GcRequest(conn.next_txn_id()), timeout)
    finally:
        conn.close()
    if not isinstance(response, GcResponse) or response.status is not StatusCode.EOK:
        raise RuntimeError(f"bookie {host}:{port}: gc refused: {response}")
    return response


def spark_read(spark: Any, uri: str, records: int, size: int) -> float:
    """``spark.read.format("aiobk")`` of the log, summing payload lengths: rows/s."""
    from pyspark.sql import functions as F

    reader = spark.read.format("aiobk").option("metadata", uri).option("log", LOG)
    started = time.perf_counter()
    total = reader.option("split", "25000").load().agg(F.sum(F.length("data"))).first()
    elapsed = time.perf_counter() - started
    assert total is not None
    assert total[0] == records * size, (total[0], records * size)
    return records / elapsed


def floor(directory: str, size: int) -> float:
    """The disk's sequential copy MB/s for ``size`` bytes (at least 64 MiB), same run."""
    size = max(size, 64 * 1024 * 1024)
    source = make_copy_source(directory, size)
    try:
        return copy_floor(source, directory, size, FLOOR_CHUNK)
    finally:
        os.remove(source)


def checks_of(results: dict[str, float], size: int) -> list[dict[str, Any]]:
    spark_ratio = results["Spark store rows/s"] / results["Spark bookies rows/s"]
    offload_ratio = results["offload MB/s"] / results["copy floor MB/s"]
    return [
        {
            "target": f"Spark rows/s from the store >= {SPARK_TARGET}x from the bookies",
            "entry bytes": size,
            "ratio": round(spark_ratio, 2),
            "pass": spark_ratio >= SPARK_TARGET,
        },
        {
            "target": f"offload MB/s >= {OFFLOAD_TARGET}x the copy floor",
            "entry bytes": size,
            "ratio": round(offload_ratio, 2),
            "pass": offload_ratio >= OFFLOAD_TARGET,
        },
    ]


@click.command("offload", help=__doc__, short_help="Offload a log; Spark reads it from the store.")
@click.option(
    "--records", type=click.IntRange(1), default=200_000, show_default=True,
    help="Records written, offloaded and read.",
)  # fmt: skip
@click.option("--size", type=click.IntRange(1), default=1024, show_default=True, help="Bytes.")
@click.option("--no-targets", is_flag=True, help="Judge no target (a smoke run).")
@json_option("offload")
@fail_on_miss_option()
def command(
    records: int, size: int, no_targets: bool, json_path: str | None, fail_on_miss: bool
) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from aiobk.pipeline import local_session

    base = tempfile.mkdtemp(prefix="aiobk-bench-offload-", dir=os.getcwd())
    store_dir = os.path.join(base, "offload")
    os.makedirs(store_dir)
    etcd = EtcdProcess(data_dir=os.path.join(base, "etcd")).start()
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, float] = {"records": records, "entry bytes": size}
    try:
        uri = etcd.uri("bench-offload")
        ports: list[int] = []
        for index in range(3):
            proc, port = start_bookie(os.path.join(base, f"bookie{index}"), uri)
            procs.append(proc)
            ports.append(port)
        results["write s"] = asyncio.run(write_log(uri, records, size))
        spark = local_session("aiobk-bench-offload")
        try:
            cold = warm_up(spark, uri, size)
            results["Spark bookies rows/s"] = spark_read(spark, uri, records, size)
        finally:
            # An offloader does not run beside a Spark job: with a Spark context
            # running in this process, the offload's file writes and socket reads cost up to
            # twice the CPU.
            spark.stop()
        seconds, nbytes, released = asyncio.run(offload(uri, "file://" + store_dir))
        results["copy floor MB/s"] = floor(base, nbytes)
        results.update(
            {
                "offload s": seconds,
                "offload bytes": nbytes,
                "ledgers released": released,
                "offload MB/s": nbytes / MB / seconds if seconds > 0 else 0.0,
            }
        )

        async def gc_all() -> list[GcResponse]:
            return list(await asyncio.gather(*(force_gc(port) for port in ports)))

        responses = asyncio.run(gc_all())
        results["bookie GC bytes freed"] = sum(r.bytes_freed for r in responses)
        results["bookie GC logs removed"] = sum(r.logs_removed for r in responses)
        spark = local_session("aiobk-bench-offload")
        try:
            warm_read(spark, uri)  # the new context's first job, before any clock
            stop_bookies(procs)  # the store read below asks no bookie
            results["Spark store rows/s"] = spark_read(spark, uri, records, size)
        finally:
            spark.stop()
    finally:
        stop_bookies(procs)
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    results.update(cold)
    console = Console()
    table = Table(title=f"{records} records of {size} B, 3 bookies, local[2] Spark, file:// store")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in results.items():
        table.add_row(name, f"{value:,.1f}" if isinstance(value, float) else f"{value:,}")
    console.print(table)
    checks = [] if no_targets else checks_of(results, size)
    path = write_report("offload", {**results, "checks": checks}, json_path)
    console.print(f"report: {path}")
    return report_checks(console, checks, fail_on_miss)


main = module_main(command, "offload")


if __name__ == "__main__":
    main()
