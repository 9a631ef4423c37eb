"""Client append throughput and latency on a local cluster (aiobk bench add).

Starts etcd and N bookies as separate processes on loopback (data on the project's disk),
measures the floor in the same run -- fdatasync p50 plus one loopback round trip -- then appends
1 KiB entries to an E3 WQ3 AQ2 ledger with 1, 64 and 512 appends in flight for a fixed time each.
Prints a table with HDR percentiles, checks the targets as ratios to the floor, writes JSON.

Mode ``tls`` runs the persistent mode over TLS: bookies with ``--tls-only`` and
``--tls-client-auth`` and certificates made for the run, the client with its own; run it beside
``persistent`` (``--modes persistent,tls``) and read the cost as the ratio of the two rows.

With ``--metadata URI`` (or AIOBK_METADATA) it measures that existing cluster instead: nothing
started, no floors or targets (its disks and network are not this machine's), modes
persistent or volatile, and every ledger it wrote deleted at the end. ``--entries`` caps the
appends of each level.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import uvloop
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from aiobk.bench.certs import CertAuthority
from aiobk.bench.cluster import start_bookies, stop_bookies
from aiobk.bench.floors import (
    fdatasync_floor,
    loopback_rtt_floor,
    new_histogram,
    quorum_fdatasync_floor,
)
from aiobk.bench.targets import (
    fail_on_miss_option,
    json_option,
    load_options,
    module_main,
    report_checks,
    write_report,
)
from aiobk.client import BookKeeper, ClientConfig, Durability
from aiobk.commands.common import metadata_option
from aiobk.metadata import EtcdProcess, MetadataURIError, redact_uri
from aiobk.protocol import GetBookieInfoRequest, GetBookieInfoResponse
from aiobk.protocol.errors import BKError


@dataclass
class Level:
    mode: str
    in_flight: int
    appends: int
    seconds: float
    appends_per_s: float
    p50_us: int
    p99_us: int
    p999_us: int
    errors: int
    fdatasyncs_per_s: float = 0.0


async def run_level(
    bk: BookKeeper,
    in_flight: int,
    seconds: float,
    size: int,
    progress: Any,
    durability: Durability = Durability.PERSISTENT,
    entries: int = 5_000_000,
) -> Level:
    lh = await bk.create_ledger(3, 3, 2, durability=durability)
    payload = os.urandom(size)
    histogram = new_histogram()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    done = 0
    started_appends = 0
    errors = 0
    task = progress.add_task(f"{in_flight:>4} in flight", total=seconds)

    async def worker() -> None:
        nonlocal done, errors
        nonlocal started_appends
        while loop.time() < deadline and started_appends < entries:
            started_appends += 1
            started = time.perf_counter_ns()
            try:
                await lh.append(payload)
            except Exception:  # a benchmark counts failures instead of stopping
                errors += 1
                return
            histogram.record_value(max(1, (time.perf_counter_ns() - started) // 1000))
            done += 1

    async def ticker() -> None:
        while loop.time() < deadline:
            progress.update(task, completed=seconds - max(0.0, deadline - loop.time()))
            await asyncio.sleep(0.2)

    started_at = loop.time()
    ticking = asyncio.ensure_future(ticker())
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = loop.time() - started_at
    ticking.cancel()
    progress.update(task, completed=seconds)
    await lh.close()
    await bk.delete_ledger(lh.ledger_id)  # a benchmark leaves no data behind
    return Level(
        durability.name.lower(),
        in_flight,
        done,
        round(elapsed, 3),
        round(done / elapsed, 1),
        histogram.get_value_at_percentile(50),
        histogram.get_value_at_percentile(99),
        histogram.get_value_at_percentile(99.9),
        errors,
    )


async def _syncs(bk: BookKeeper) -> int | None:
    """Journal and ledger-storage fdatasyncs so far, summed over the bookies (None when a
    bookie does not say: an existing cluster may refuse a client without the admin role)."""
    total = 0
    for info in await bk.store.list_bookies():
        try:
            conn = await bk.pool.get(info.bookie_id)
            response = await conn.call(GetBookieInfoRequest(0), 10)
        except BKError:
            return None
        if not isinstance(response, GetBookieInfoResponse):
            return None
        total += response.stats["journal_syncs"] + response.stats["storage_syncs"]
    return total


async def run(
    uri: str,
    levels: list[int],
    seconds: float,
    size: int,
    durability: Durability,
    tls: ssl.SSLContext | None = None,
    entries: int = 5_000_000,
) -> list[Level]:
    results = []
    async with await BookKeeper.connect(uri, ClientConfig(), tls=tls) as bk:
        with Progress(transient=True) as progress:
            warm = await bk.create_ledger(3, 3, 2)
            await asyncio.gather(*(warm.append(b"w" * size) for _ in range(min(2000, entries))))
            await warm.close()
            await bk.delete_ledger(warm.ledger_id)
            for level in levels:
                before = await _syncs(bk)
                result = await run_level(bk, level, seconds, size, progress, durability, entries)
                after = await _syncs(bk)
                if before is not None and after is not None:
                    result.fdatasyncs_per_s = round((after - before) / result.seconds, 1)
                results.append(result)
    return results


def measure_cluster(
    uri: str, seconds: float, entry_size: int, levels: list[int], modes: list[str], entries: int
) -> list[Level]:
    """Each mode's levels against the existing cluster at ``uri`` (no servers started, no
    floors measured: the cluster's disks and network are not this machine's)."""
    results: list[Level] = []
    for mode in modes:
        if mode not in ("persistent", "volatile"):
            raise click.UsageError(
                f"mode {mode} starts bookies of its own; with --metadata use persistent or "
                "volatile (--durability)"
            )
        durability = Durability.VOLATILE if mode == "volatile" else Durability.PERSISTENT
        try:
            levels_run = uvloop.run(
                run(uri, levels, seconds, entry_size, durability, entries=entries)
            )
        except MetadataURIError as exc:
            raise click.UsageError(str(exc)) from None
        except BKError as exc:
            raise click.ClickException(str(exc)) from None
        for level in levels_run:
            level.mode = mode
        results.extend(levels_run)
    return results


@dataclass
class Floors:
    """The floors measured in the same run (microseconds, p50)."""

    fdatasync_us: int
    loopback_rtt_us: int
    quorum_fdatasync_us: int

    @property
    def floor_us(self) -> int:
        return self.fdatasync_us + self.loopback_rtt_us

    @property
    def quorum_floor_us(self) -> int:
        return self.quorum_fdatasync_us + self.loopback_rtt_us


def measure(
    bookies: int,
    seconds: float,
    entry_size: int,
    levels: list[int],
    modes: list[str],
    entries: int = 5_000_000,
) -> tuple[Floors, list[Level]]:
    """Start etcd, measure the floors, then each mode's levels on fresh bookie processes."""
    base = tempfile.mkdtemp(prefix="aiobk-bench-", dir=os.getcwd())
    etcd = EtcdProcess(data_dir=os.path.join(base, "etcd")).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        floors = measure_floors(base)
        results: list[Level] = []
        for index, mode in enumerate(modes):
            extra: tuple[str, ...] = ()
            tls = None
            if mode == "journal-less":
                extra = ("--no-journal-write-data",)
            elif mode == "tls":
                extra, tls = _tls_setup(os.path.join(base, "certs"))
            uri = etcd.uri(f"bench{index}")
            procs = start_bookies(bookies, os.path.join(base, f"{mode}-{index}"), uri, extra)
            durability = Durability.VOLATILE if mode == "volatile" else Durability.PERSISTENT
            try:
                levels_run = uvloop.run(
                    run(uri, levels, seconds, entry_size, durability, tls, entries)
                )
            finally:
                stop_bookies(procs)
                procs = []
            for level in levels_run:
                level.mode = mode
            results.extend(levels_run)
    finally:
        stop_bookies(procs)
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    return floors, results


def measure_floors(directory: str) -> Floors:
    """The three floors, with data on ``directory``'s disk (``aiobk bench peers`` too)."""
    sync = fdatasync_floor(directory, 2000)
    rtt = loopback_rtt_floor(3000)
    quorum = quorum_fdatasync_floor(directory, writers=3, kth=2, count=1500)
    return Floors(
        sync.get_value_at_percentile(50),
        rtt.get_value_at_percentile(50),
        quorum.get_value_at_percentile(50),
    )


def _tls_setup(directory: str) -> tuple[tuple[str, ...], ssl.SSLContext]:
    """Certificates for a TLS run: the bookies' flags, and the client's context (its
    certificate has the admin role too: the benchmark reads the bookies' sync counts)."""
    ca = CertAuthority(Path(directory))
    bookie = ca.issue("bench-bookie", roles=("bookie",))
    client = ca.issue("bench-client", roles=("client", "admin"))
    flags = (
        "--tls-cert-file", str(bookie.cert), "--tls-key-file", str(bookie.key),
        "--tls-ca-file", str(ca.ca_file), "--tls-only", "--tls-client-auth",
    )  # fmt: skip
    context = ssl.create_default_context(cafile=str(ca.ca_file))
    context.load_cert_chain(*client.files)
    return flags, context


def check_targets(floors: Floors, results: list[Level]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    by_level = {r.in_flight: r for r in results if r.mode == "persistent"}
    if 1 in by_level:
        ratio = by_level[1].p50_us / floors.floor_us
        checks.append({"target": "1 in flight: p50 <= 2x floor", "ratio": round(ratio, 2),
                       "quorum_floor_ratio": round(by_level[1].p50_us / floors.quorum_floor_us, 2),
                       "pass": ratio <= 2.0})  # fmt: skip
    if 512 in by_level:
        rate = by_level[512].appends_per_s
        checks.append({"target": "512 in flight: >= 15000 appends/s", "measured": rate,
                       "pass": rate >= 15000})  # fmt: skip
    return checks


def print_table(
    console: Console, floors: Floors | None, results: list[Level], bookies: int | str,
    seconds: float, entry_size: int,
) -> None:  # fmt: skip
    if floors is None:
        title = (
            f"appends, E3 WQ3 AQ2, {entry_size} B, on {bookies}, {seconds:g} s per level "
            "(no floors: the cluster's disks and network are not this machine's)"
        )
        floor_us = quorum_floor_us = 0
    else:
        floor_us, quorum_floor_us = floors.floor_us, floors.quorum_floor_us
        title = (
            f"appends, E3 WQ3 AQ2, {entry_size} B, {bookies} bookies, "
            f"{seconds:g} s per level (floor {floor_us} us = fdatasync {floors.fdatasync_us} "
            f"+ RTT {floors.loopback_rtt_us}; quorum floor {quorum_floor_us} us = 2nd of 3 "
            f"concurrent fdatasyncs {floors.quorum_fdatasync_us} + RTT)"
        )
    table = Table(title=title)
    for column in (
        "mode",
        "in flight",
        "appends/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "p50 / floor",
        "p50 / quorum floor",
        "fdatasync/s",
        "errors",
    ):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.mode, str(r.in_flight), f"{r.appends_per_s:.0f}", str(r.p50_us), str(r.p99_us),
            str(r.p999_us),
            f"{r.p50_us / floor_us:.2f}" if floor_us else "-",
            f"{r.p50_us / quorum_floor_us:.2f}" if quorum_floor_us else "-",
            f"{r.fdatasyncs_per_s:.0f}",
            str(r.errors),
        )  # fmt: skip
    console.print(table)


def _modes(
    modes: str, durability: str | None, no_journal_write_data: bool
) -> list[str]:  # fmt: skip
    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    if durability or no_journal_write_data:
        chosen = ["journal-less" if no_journal_write_data else durability or "persistent"]
    unknown = set(chosen) - {"persistent", "volatile", "journal-less", "tls"}
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown mode(s): {', '.join(sorted(unknown)) or modes!r}", param_hint="--modes"
        )
    return chosen


@click.command(
    "add", help=__doc__, short_help="Client appends on a local cluster, against the floors."
)
@click.option(
    "--bookies", type=click.IntRange(1, 32), default=3, show_default=True,
    help="Bookie processes in the cluster the run starts.",
)  # fmt: skip
@load_options("1,64,512", "appends")
@json_option("add")
@click.option(
    "--modes",
    default="persistent",
    show_default=True,
    help="Comma list of persistent, volatile (BP-14: acknowledged once written), "
    "journal-less (BP-46: bookies started with --no-journal-write-data) and tls (persistent "
    "over TLS with client certificates).",
)
@click.option(
    "--durability", type=click.Choice(["persistent", "volatile"]), default=None,
    help="One mode only (instead of --modes).",
)  # fmt: skip
@click.option(
    "--no-journal-write-data", is_flag=True, help="The journal-less mode only (instead of --modes)."
)
@click.option(
    "--entries", type=click.IntRange(min=1), default=5_000_000, show_default=True,
    help="Appends per in-flight level at most (a level ends at --seconds or at this count).",
)  # fmt: skip
@metadata_option
@fail_on_miss_option()
def command(
    bookies: int,
    seconds: float,
    entry_size: int,
    levels: list[int],
    json_path: str | None,
    modes: str,
    durability: str | None,
    no_journal_write_data: bool,
    entries: int,
    metadata: str | None,
    fail_on_miss: bool,
) -> int:
    """With --metadata (or AIOBK_METADATA) the run measures that cluster instead: no servers
    started, no floors, the ledgers it writes deleted at the end."""
    chosen = _modes(modes, durability, no_journal_write_data)
    console = Console(width=160)
    floors: Floors | None
    if metadata:
        floors = None
        results = measure_cluster(metadata, seconds, entry_size, levels, chosen, entries)
        print_table(console, None, results, redact_uri(metadata), seconds, entry_size)
        checks: list[dict[str, Any]] = []
    else:
        floors, results = measure(bookies, seconds, entry_size, levels, chosen, entries)
        print_table(console, floors, results, bookies, seconds, entry_size)
        checks = check_targets(floors, results)
    report: dict[str, Any] = {
        "modes": chosen,
        "cluster": redact_uri(metadata) if metadata else None,
        "entry_size": entry_size,
        "floor_us": floors.floor_us if floors else None,
        "fdatasync_p50_us": floors.fdatasync_us if floors else None,
        "loopback_rtt_p50_us": floors.loopback_rtt_us if floors else None,
        "quorum_fdatasync_p50_us": floors.quorum_fdatasync_us if floors else None,
        "quorum_floor_us": floors.quorum_floor_us if floors else None,
        "levels": [asdict(r) for r in results],
        "checks": checks,
    }
    path = write_report("add", report, json_path)
    console.print(f"wrote {path}")
    return report_checks(console, checks, fail_on_miss)


main = module_main(command, "add")


if __name__ == "__main__":
    main()
