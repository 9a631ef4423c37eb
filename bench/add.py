"""Client append throughput and latency on a local cluster (aiobk bench add).

Starts etcd and N bookies as separate processes on loopback (data on the project's disk),
measures the floor in the same run -- fdatasync p50 plus one loopback round trip -- then appends
1 KiB entries to an E3 WQ3 AQ2 ledger with 1, 64 and 512 appends in flight for a fixed time each.
Prints a table with HDR percentiles, checks the targets as ratios to the floor, writes JSON.

Mode ``tls`` runs the persistent mode over TLS: bookies with ``--tls-only`` and
``--tls-client-auth`` and certificates made for the run, the client with its own; run it beside
``persistent`` (``--modes persistent,tls``) and read the cost as the ratio of the two rows.

Modes ``log`` and ``log-producer`` append through a log writer (envelope records, a fresh log
per level) instead of to a ledger: ``log-producer`` opens it with a producer id and gives each
append its sequence, ``log`` without. Alternate them (``--modes log,log-producer,log,...``):
each ``log-producer`` level is paired with the ``log`` level before it at the same in-flight
count, and the ratio of the two is the cost of sequences. Consecutive log modes share one
cluster, so the levels compared run seconds apart.

With ``--metadata URI`` (or AIOBK_METADATA) it measures that existing cluster instead: nothing
started, no floors or the targets against them (its disks and network are not this
machine's), modes persistent, volatile, log or log-producer, and every ledger and log it wrote
deleted at the end. ``--entries`` caps the appends of each level.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
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

MODES = ("persistent", "volatile", "journal-less", "tls", "log", "log-producer")
# The modes that append through a log writer: the producer id each opens it with (None: none).
LOG_MODES: dict[str, str | None] = {"log": None, "log-producer": "bench-producer"}
PRODUCER_COST_TARGET = 0.95  # 512 in flight: appends/s with sequences over without, at least

Append = Callable[[bytes], Awaitable[object]]


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
    client_cpu_us: float = 0.0  # the benchmark process's CPU per acknowledged append


async def run_level(
    bk: BookKeeper,
    in_flight: int,
    seconds: float,
    size: int,
    progress: Any,
    durability: Durability = Durability.PERSISTENT,
    entries: int = 5_000_000,
    mode: str = "persistent",
) -> Level:
    append, remove = await open_target(bk, mode, durability)
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
                await append(payload)
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
    cpu_before = time.process_time()
    ticking = asyncio.ensure_future(ticker())
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = loop.time() - started_at
    cpu = time.process_time() - cpu_before
    ticking.cancel()
    progress.update(task, completed=seconds)
    await remove()  # a benchmark leaves no data behind
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
        client_cpu_us=round(cpu * 1e6 / done, 1) if done else 0.0,
    )


async def open_target(
    bk: BookKeeper, mode: str, durability: Durability
) -> tuple[Append, Callable[[], Awaitable[object]]]:
    """What a level appends to and how it is removed afterwards: an E3 WQ3 AQ2 ledger, or in
    a log mode a log writer on a new log of such ledgers; ``log-producer`` gives each append
    the next sequence itself, as an application resuming at ``last_sequence + 1`` does."""
    if mode not in LOG_MODES:
        lh = await bk.create_ledger(3, 3, 2, durability=durability)

        async def remove_ledger() -> None:
            await lh.close()
            await bk.delete_ledger(lh.ledger_id)

        return lh.append, remove_ledger
    name = f"bench-add-{uuid.uuid4().hex[:12]}"
    producer_id = LOG_MODES[mode]
    writer = await bk.open_log_writer(name, durability=durability, producer_id=producer_id)

    async def remove_log() -> None:
        await writer.close()
        await bk.delete_log(name)

    if producer_id is None:

        async def append_record(data: bytes) -> object:
            return await writer.append(data)

        return append_record, remove_log
    sequence = writer.last_sequence

    async def append_sequenced(data: bytes) -> object:
        nonlocal sequence
        sequence += 1
        mine = sequence
        position = await writer.append(data, sequence=mine)
        if position is None:  # each sequence is new: a duplicate is a fault, counted so
            raise RuntimeError(f"sequence {mine} was not appended")
        return position

    return append_sequenced, remove_log


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
    modes: tuple[str, ...] = ("persistent",),
) -> list[Level]:
    """Each of ``modes``' levels in turn, on one client after a warm-up."""
    results = []
    async with await BookKeeper.connect(uri, ClientConfig(), tls=tls) as bk:
        with Progress(transient=True) as progress:
            warm = await bk.create_ledger(3, 3, 2)
            await asyncio.gather(*(warm.append(b"w" * size) for _ in range(min(2000, entries))))
            await warm.close()
            await bk.delete_ledger(warm.ledger_id)
            for mode, level in [(mode, level) for mode in modes for level in levels]:
                before = await _syncs(bk)
                result = await run_level(
                    bk, level, seconds, size, progress, durability, entries, mode
                )
                after = await _syncs(bk)
                if before is not None and after is not None:
                    result.fdatasyncs_per_s = round((after - before) / result.seconds, 1)
                result.mode = mode
                results.append(result)
    return results


def groups(modes: list[str]) -> list[tuple[str, ...]]:
    """``modes`` as the runs that measure them: each mode on servers of its own, except that
    consecutive log modes share one cluster (they differ only in the client), so that
    alternating them compares levels seconds apart rather than a cluster's start apart."""
    found: list[tuple[str, ...]] = []
    for mode in modes:
        if mode in LOG_MODES and found and found[-1][0] in LOG_MODES:
            found[-1] = (*found[-1], mode)
        else:
            found.append((mode,))
    return found


def measure_cluster(
    uri: str, seconds: float, entry_size: int, levels: list[int], modes: list[str], entries: int
) -> list[Level]:
    """Each mode's levels against the existing cluster at ``uri`` (no servers started, no
    floors measured: the cluster's disks and network are not this machine's)."""
    results: list[Level] = []
    for group in groups(modes):
        mode = group[0]
        if mode in ("journal-less", "tls"):
            raise click.UsageError(
                f"mode {mode} starts bookies of its own; with --metadata use persistent or "
                "volatile (--durability), log or log-producer"
            )
        durability = Durability.VOLATILE if mode == "volatile" else Durability.PERSISTENT
        try:
            results += uvloop.run(
                run(uri, levels, seconds, entry_size, durability, entries=entries, modes=group)
            )
        except MetadataURIError as exc:
            raise click.UsageError(str(exc)) from None
        except BKError as exc:
            raise click.ClickException(str(exc)) from None
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
        for index, group in enumerate(groups(modes)):
            mode = group[0]
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
                results += uvloop.run(
                    run(uri, levels, seconds, entry_size, durability, tls, entries, group)
                )
            finally:
                stop_bookies(procs)
                procs = []
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


def producer_pairs(results: list[Level]) -> list[dict[str, Any]]:
    """Each ``log-producer`` level beside the ``log`` level before it at the same in-flight
    count: appends/s with sequences over without, the p50 latencies' ratio, and the client's
    CPU per append of each."""
    plain: dict[int, Level] = {}
    pairs: list[dict[str, Any]] = []
    for r in results:
        if r.mode == "log":
            plain[r.in_flight] = r
        elif r.mode == "log-producer" and r.in_flight in plain:
            before = plain.pop(r.in_flight)
            pairs.append({
                "in_flight": r.in_flight,
                "log_appends_per_s": before.appends_per_s,
                "producer_appends_per_s": r.appends_per_s,
                "ratio": round(r.appends_per_s / before.appends_per_s, 3)
                if before.appends_per_s else 0.0,
                "log_p50_us": before.p50_us,
                "producer_p50_us": r.p50_us,
                "p50_ratio": round(r.p50_us / before.p50_us, 3) if before.p50_us else 0.0,
                "log_client_cpu_us": before.client_cpu_us,
                "producer_client_cpu_us": r.client_cpu_us,
            })  # fmt: skip
    return pairs


def check_producer_cost(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """512 in flight: the median of the pairs' ratios at least ``PRODUCER_COST_TARGET``."""
    ratios = [p["ratio"] for p in pairs if p["in_flight"] == 512]
    if not ratios:
        return []
    median = statistics.median(ratios)
    return [{
        "target": f"512 in flight: log writer with sequences >= {PRODUCER_COST_TARGET}x "
        "without (median of the pairs)",
        "median": round(median, 3), "pairs": len(ratios),
        "range": [min(ratios), max(ratios)], "pass": median >= PRODUCER_COST_TARGET,
    }]  # fmt: skip


def print_pairs(console: Console, pairs: list[dict[str, Any]]) -> None:
    table = Table(title="log writer with sequences (log-producer) against the log row before it")
    for column in (
        "in flight", "log appends/s", "log-producer appends/s", "ratio", "log p50 us",
        "log-producer p50 us", "p50 ratio", "client CPU us/append log / log-producer",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for p in pairs:
        table.add_row(
            str(p["in_flight"]), f"{p['log_appends_per_s']:.0f}",
            f"{p['producer_appends_per_s']:.0f}", f"{p['ratio']:.3f}", str(p["log_p50_us"]),
            str(p["producer_p50_us"]), f"{p['p50_ratio']:.3f}",
            f"{p['log_client_cpu_us']:.1f} / {p['producer_client_cpu_us']:.1f}",
        )  # fmt: skip
    console.print(table)


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
        "client CPU us/append",
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
            f"{r.client_cpu_us:.1f}",
            str(r.errors),
        )  # fmt: skip
    console.print(table)


def _modes(
    modes: str, durability: str | None, no_journal_write_data: bool
) -> list[str]:  # fmt: skip
    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    if durability or no_journal_write_data:
        chosen = ["journal-less" if no_journal_write_data else durability or "persistent"]
    unknown = set(chosen) - set(MODES)
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
    "journal-less (BP-46: bookies started with --no-journal-write-data), tls (persistent "
    "over TLS with client certificates), log (through a log writer) and log-producer (a log "
    "writer with a producer id, each append given its sequence); a mode may repeat, to "
    "alternate.",
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
    pairs = producer_pairs(results)
    if pairs:
        print_pairs(console, pairs)
        checks += check_producer_cost(pairs)
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
        "producer_pairs": pairs,
        "checks": checks,
    }
    path = write_report("add", report, json_path)
    console.print(f"wrote {path}")
    return report_checks(console, checks, fail_on_miss)


main = module_main(command, "add")


if __name__ == "__main__":
    main()
