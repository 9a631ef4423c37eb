"""Latency of metadata operations against a local etcd (python -m aiobk.bench.metadata).

Starts its own etcd on loopback (data on the project's disk), then times, one at a time:
ledger id allocation, ledger create, compare-and-set update and read, and reports them next to
the fdatasync floor of the same disk (every etcd write waits for etcd's own WAL fsync).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import click
import uvloop
from rich.console import Console
from rich.table import Table

from aiobk.bench.floors import fdatasync_floor, new_histogram
from aiobk.bench.targets import json_option, module_main, write_report
from aiobk.metadata import EtcdProcess, Fragment, LedgerMetadata, open_store

ENSEMBLE = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


async def measure(uri: str, count: int) -> dict[str, dict[str, float]]:
    store = open_store(uri)
    histograms = {name: new_histogram() for name in ("allocate id", "create", "CAS update", "read")}

    def record(name: str, started: int) -> None:
        histograms[name].record_value(max(1, (time.perf_counter_ns() - started) // 1000))

    try:
        template = LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),))
        for _ in range(count):
            started = time.perf_counter_ns()
            ledger_id = await store.allocate_ledger_id()
            record("allocate id", started)
            started = time.perf_counter_ns()
            created = await store.create_ledger(ledger_id, template)
            record("create", started)
            started = time.perf_counter_ns()
            await store.write_ledger(ledger_id, created.replace(length=1))
            record("CAS update", started)
            started = time.perf_counter_ns()
            await store.read_ledger(ledger_id)
            record("read", started)
    finally:
        await store.close()
    return {
        name: {
            "p50_us": h.get_value_at_percentile(50),
            "p99_us": h.get_value_at_percentile(99),
            "mean_us": round(h.get_mean_value(), 1),
        }
        for name, h in histograms.items()
    }


@click.command(
    "metadata", help=__doc__, short_help="Metadata operations, one at a time, on a local etcd."
)
@click.option(
    "--count", type=click.IntRange(1), default=500, show_default=True,
    help="Operations of each kind.",
)  # fmt: skip
@json_option("metadata")
def command(count: int, json_path: str | None) -> int:
    base = tempfile.mkdtemp(prefix="aiobk-bench-", dir=os.getcwd())
    etcd = EtcdProcess(data_dir=os.path.join(base, "etcd")).start()
    try:
        floor = fdatasync_floor(base, 1000)
        results = uvloop.run(measure(etcd.uri("bench"), count))
    finally:
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    table = Table(title=f"metadata operations on a local etcd, {count} each, one at a time")
    for column in ("operation", "p50 us", "p99 us", "mean us", "p50 / fdatasync p50"):
        table.add_column(column, justify="right")
    sync_p50 = floor.get_value_at_percentile(50)
    table.add_row(
        "fdatasync 4 KiB (floor)",
        str(sync_p50),
        str(floor.get_value_at_percentile(99)),
        f"{floor.get_mean_value():.0f}",
        "1.00",
    )
    for name, figures in results.items():
        table.add_row(
            name,
            str(figures["p50_us"]),
            str(figures["p99_us"]),
            f"{figures['mean_us']:.0f}",
            f"{figures['p50_us'] / sync_p50:.2f}",
        )
    Console().print(table)
    write_report("metadata", {"fdatasync_p50_us": sync_p50, "operations": results}, json_path)
    return 0


main = module_main(command, "metadata")


if __name__ == "__main__":
    main()
