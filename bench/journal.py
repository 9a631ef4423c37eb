"""Bookie add throughput and latency against the fdatasync and loopback floors (make bench).

One run measures, in order: the fdatasync floor of the data disk, the loopback round-trip floor,
then a bookie (its own process, data on the same disk) taking 1 KiB adds over loopback with 1,
16 and 256 adds in flight for a fixed time each, then at each offered rate of ``--rates`` (an
open loop; none by default). Each level also reports the journal bytes the bookie wrote per
payload byte (its padding included). It prints a table, checks the targets as ratios against
the floors of the same run, and writes JSON. See bench/README.md for how to read it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import click
import uvloop
from rich.console import Console
from rich.table import Table

from aiobk.bench.cluster import start_bookie, stop_bookies
from aiobk.bench.floors import (
    fdatasync_floor,
    loopback_rtt_floor,
    new_histogram,
    process_cpu_seconds,
)
from aiobk.bench.loops import open_loop
from aiobk.bench.targets import (
    fail_on_miss_option,
    json_option,
    load_options,
    module_main,
    positive_numbers,
    report_checks,
    write_report,
)
from aiobk.client import BookieConnection, Digester
from aiobk.protocol import (
    AddRequest,
    DigestType,
    Durability,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    Response,
    StatusCode,
    master_key,
)


@dataclass
class LevelResult:
    in_flight: int
    adds: int
    seconds: float
    adds_per_s: float
    p50_us: int
    p99_us: int
    p999_us: int
    fdatasyncs: int
    fdatasyncs_per_s: float
    adds_per_fdatasync: float
    errors: int
    journal_bytes: int = 0  # written by the journal during the level, padding included
    journal_bytes_per_payload_byte: float = 0.0  # over adds x entry size
    bookie_cpu_us_per_add: float = 0.0  # the bookie process's user + system CPU over adds


@dataclass
class RateResult:
    """One open-loop level: adds offered at a fixed rate, latency from each one's intended
    send time (``bench.loops.open_loop``)."""

    offered_per_s: float
    adds: int
    seconds: float
    adds_per_s: float
    p50_us: int
    p99_us: int
    p999_us: int
    send_lag_p99_us: int
    # From the call to the answer (the client's own lateness left out: at a few hundred adds
    # per second it is up to a millisecond of timer resolution, more than a lone add costs).
    sent_p50_us: int
    sent_p99_us: int
    sent_p999_us: int
    fdatasyncs_per_s: float
    adds_per_fdatasync: float
    journal_bytes: int
    journal_bytes_per_payload_byte: float
    bookie_cpu_us_per_add: float
    errors: int
    unfinished: int


OPEN_LOOP_CAP = 512  # adds outstanding at most in an open-loop level
OPEN_LOOP_DRAIN = 10.0  # seconds after the last intended send before a level is cut off


async def settle() -> None:
    """Before an open-loop level: write back what the saturating levels before it left dirty
    in the page cache, and pause, so that the level measures itself and not that writeback
    (as ``bench peers`` does before each of its levels)."""
    await asyncio.to_thread(os.sync)
    await asyncio.sleep(1.0)


async def _stats(conn: BookieConnection) -> dict[str, int]:
    response = await conn.call(GetBookieInfoRequest(0), 10)
    assert isinstance(response, GetBookieInfoResponse)
    return response.stats


def _per_payload_byte(journal_bytes: int, adds: int, entry_size: int) -> float:
    return round(journal_bytes / max(1, adds * entry_size), 3)


def _cpu(pid: int | None) -> float:
    return 0.0 if pid is None else process_cpu_seconds(pid)


async def run_level(
    conn: BookieConnection,
    ledger_id: int,
    in_flight: int,
    seconds: float,
    entry_size: int,
    durability: Durability = Durability.PERSISTENT,
    bookie_pid: int | None = None,
) -> LevelResult:
    """Keep ``in_flight`` adds outstanding for ``seconds`` (bounded by time and count);
    ``bookie_pid``: the bookie's process, whose CPU per add is reported."""
    loop = asyncio.get_running_loop()
    digest = Digester(DigestType.CRC32C)
    key = master_key(b"bench")
    payload = os.urandom(entry_size)
    histogram = new_histogram()
    before = await _stats(conn)
    cpu_before = _cpu(bookie_pid)
    done = loop.create_future()
    state = {"next": 0, "completed": 0, "outstanding": 0, "errors": 0}
    deadline = loop.time() + seconds
    max_adds = 5_000_000

    def send_one() -> None:
        entry = state["next"]
        state["next"] = entry + 1
        state["outstanding"] += 1
        body = digest.encode(ledger_id, entry, entry - 1, (entry + 1) * entry_size, payload)
        request = AddRequest(
            conn.next_txn_id(), ledger_id, entry, durability=durability, master_key=key, body=body
        )
        started = time.perf_counter_ns()
        future = conn.send(request, 30)
        future.add_done_callback(lambda f: on_done(f, started))

    def on_done(future: asyncio.Future[Response], started: int) -> None:
        state["outstanding"] -= 1
        if future.exception() is not None or future.result().status is not StatusCode.EOK:
            state["errors"] += 1
        else:
            histogram.record_value(max(1, (time.perf_counter_ns() - started) // 1000))
            state["completed"] += 1
        if loop.time() < deadline and state["next"] < max_adds and state["errors"] == 0:
            send_one()
        elif state["outstanding"] == 0 and not done.done():
            done.set_result(None)

    started_at = loop.time()
    for _ in range(in_flight):
        send_one()
    await asyncio.wait_for(done, seconds + 60)
    elapsed = loop.time() - started_at
    after = await _stats(conn)
    cpu = _cpu(bookie_pid) - cpu_before
    syncs = after["journal_syncs"] - before["journal_syncs"]
    journal_bytes = after["journal_bytes"] - before["journal_bytes"]
    completed = state["completed"]
    return LevelResult(
        in_flight=in_flight,
        adds=completed,
        seconds=round(elapsed, 3),
        adds_per_s=round(completed / elapsed, 1),
        p50_us=histogram.get_value_at_percentile(50),
        p99_us=histogram.get_value_at_percentile(99),
        p999_us=histogram.get_value_at_percentile(99.9),
        fdatasyncs=syncs,
        fdatasyncs_per_s=round(syncs / elapsed, 1),
        adds_per_fdatasync=round(completed / max(1, syncs), 2),
        errors=state["errors"],
        journal_bytes=journal_bytes,
        journal_bytes_per_payload_byte=_per_payload_byte(journal_bytes, completed, entry_size),
        bookie_cpu_us_per_add=round(cpu * 1e6 / max(1, completed), 1),
    )


async def run_rate(
    conn: BookieConnection,
    ledger_id: int,
    rate: float,
    seconds: float,
    entry_size: int,
    durability: Durability = Durability.PERSISTENT,
    bookie_pid: int | None = None,
) -> RateResult:
    """Offer adds at ``rate`` per second for ``seconds`` (an open loop: each add is sent at
    its time whatever the ones before are doing, at most ``OPEN_LOOP_CAP`` outstanding)."""
    digest = Digester(DigestType.CRC32C)
    key = master_key(b"bench")
    payload = os.urandom(entry_size)
    sent = new_histogram()
    next_entry = 0

    async def add(data: bytes) -> None:
        nonlocal next_entry
        entry, next_entry = next_entry, next_entry + 1
        body = digest.encode(ledger_id, entry, entry - 1, (entry + 1) * entry_size, data)
        request = AddRequest(
            conn.next_txn_id(), ledger_id, entry, durability=durability, master_key=key, body=body
        )
        started = time.perf_counter_ns()
        response = await conn.send(request, 30)
        if response.status is not StatusCode.EOK:
            raise RuntimeError(f"add {entry}: {response.status.name}")
        sent.record_value(max(1, (time.perf_counter_ns() - started) // 1000))

    before = await _stats(conn)
    cpu_before = _cpu(bookie_pid)
    result = await open_loop(add, payload, rate, seconds, OPEN_LOOP_CAP, OPEN_LOOP_DRAIN)
    after = await _stats(conn)
    cpu = _cpu(bookie_pid) - cpu_before
    syncs = after["journal_syncs"] - before["journal_syncs"]
    journal_bytes = after["journal_bytes"] - before["journal_bytes"]
    return RateResult(
        offered_per_s=rate,
        adds=result.ops,
        seconds=round(result.seconds, 3),
        adds_per_s=round(result.ops_per_s, 1),
        p50_us=result.latency.get_value_at_percentile(50),
        p99_us=result.latency.get_value_at_percentile(99),
        p999_us=result.latency.get_value_at_percentile(99.9),
        send_lag_p99_us=result.send_lag.get_value_at_percentile(99),
        sent_p50_us=sent.get_value_at_percentile(50),
        sent_p99_us=sent.get_value_at_percentile(99),
        sent_p999_us=sent.get_value_at_percentile(99.9),
        fdatasyncs_per_s=round(syncs / max(1e-9, result.seconds), 1),
        adds_per_fdatasync=round(result.ops / max(1, syncs), 2),
        journal_bytes=journal_bytes,
        journal_bytes_per_payload_byte=_per_payload_byte(journal_bytes, result.ops, entry_size),
        bookie_cpu_us_per_add=round(cpu * 1e6 / max(1, result.ops), 1),
        errors=result.errors,
        unfinished=result.unfinished,
    )


async def bench_bookie(
    port: int,
    levels: list[int],
    seconds: float,
    size: int,
    durability: Durability = Durability.PERSISTENT,
    rates: Sequence[float] = (),
    bookie_pid: int | None = None,
) -> tuple[list[LevelResult], list[RateResult]]:
    conn = await BookieConnection.open("127.0.0.1", port)
    try:
        results = []
        warm_up = min(1.0, seconds)
        for index, level in enumerate(levels):
            await run_level(conn, 1000 + index, level, warm_up, size, durability)
            results.append(
                await run_level(conn, 2000 + index, level, seconds, size, durability, bookie_pid)
            )
        paced = []
        for index, rate in enumerate(rates):
            await settle()
            await run_level(conn, 3000 + index, 1, warm_up, size, durability)
            paced.append(
                await run_rate(conn, 4000 + index, rate, seconds, size, durability, bookie_pid)
            )
        return results, paced
    finally:
        conn.close()


def bookie_config(base: str, journal_alignment: int | None) -> tuple[str, ...]:
    """The bookie's command-line extras: a config file with the settings given, if any."""
    if journal_alignment is None:
        return ()
    path = os.path.join(base, "bookie.toml")
    with open(path, "w") as handle:
        handle.write(f"journal_alignment = {journal_alignment}\n")
    return ("--config", path)


def check_targets(
    levels: list[LevelResult], sync_p50: float, sync_mean: float, rtt_p50: float
) -> list[dict[str, Any]]:
    checks = []
    by_level = {r.in_flight: r for r in levels}
    if 1 in by_level:
        bound = sync_p50 + 2 * rtt_p50 + 150
        p50 = by_level[1].p50_us
        checks.append(
            {
                "target": "1 in flight: p50 <= fdatasync p50 + 2 RTT + 150 us",
                "measured_us": p50,
                "bound_us": round(bound, 1),
                "ratio": round(p50 / bound, 3),
                "pass": p50 <= bound,
            }
        )
    if 256 in by_level:
        floor_rate = 1e6 / sync_mean
        rate = by_level[256].adds_per_s
        checks.append(
            {
                "target": "256 in flight: adds/s >= 4x one-fdatasync-per-add rate",
                "measured": rate,
                "floor_adds_per_s": round(floor_rate, 1),
                "ratio": round(rate / floor_rate, 2),
                "pass": rate >= 4 * floor_rate,
            }
        )
        per_sync = by_level[256].adds_per_fdatasync
        checks.append(
            {
                "target": "256 in flight: >= 10 adds per fdatasync",
                "measured": per_sync,
                "pass": per_sync >= 10,
            }
        )
    return checks


@click.command(
    "journal",
    help=__doc__,
    short_help="One bookie's adds against the fdatasync and loopback floors.",
)
@load_options("1,16,256", "adds")
@click.option(
    "--durability",
    type=click.Choice(["persistent", "volatile"]),
    default="persistent",
    show_default=True,
    help="volatile (BP-14): adds are answered once written, synced later.",
)
@click.option(
    "--rates", default="", show_default=True, callback=positive_numbers(float, "adds/s"),
    help="Comma list of offered adds/s, each an open-loop level after the in-flight ones.",
)  # fmt: skip
@click.option(
    "--journal-alignment", type=click.IntRange(0), default=None,
    help="The bookie's journal_alignment setting (default: the bookie's default).",
)  # fmt: skip
@click.option(
    "--data-dir", type=click.Path(file_okay=False), default=None,
    help="Where the bookie and the floor write (default: a temporary directory here).",
)  # fmt: skip
@json_option("journal")
@fail_on_miss_option()
def command(
    seconds: float,
    entry_size: int,
    levels: list[int],
    durability: str,
    rates: list[float],
    journal_alignment: int | None,
    data_dir: str | None,
    json_path: str | None,
    fail_on_miss: bool,
) -> int:
    console = Console()
    base = data_dir or tempfile.mkdtemp(prefix="aiobk-bench-", dir=os.getcwd())
    os.makedirs(base, exist_ok=True)
    try:
        console.print(f"[bold]floors[/bold] (data disk under {base})")
        sync = fdatasync_floor(base, 2000)
        rtt = loopback_rtt_floor(5000)
        sync_p50, sync_mean = sync.get_value_at_percentile(50), sync.get_mean_value()
        rtt_p50 = rtt.get_value_at_percentile(50)
        extra = bookie_config(base, journal_alignment)
        process, port = start_bookie(os.path.join(base, "bookie"), extra=extra)
        try:
            results, paced = uvloop.run(
                bench_bookie(
                    port,
                    levels,
                    seconds,
                    entry_size,
                    Durability[durability.upper()],
                    rates,
                    process.pid,
                )
            )
        finally:
            stop_bookies([process])
    finally:
        if data_dir is None:
            shutil.rmtree(base, ignore_errors=True)

    floor = Table(title="floors (same run)")
    for column in ("floor", "p50 us", "p99 us", "mean us", "ops/s"):
        floor.add_column(column, justify="right")
    for name, hist in (("fdatasync 4 KiB", sync), ("loopback RTT 64 B", rtt)):
        mean = hist.get_mean_value()
        floor.add_row(
            name,
            str(hist.get_value_at_percentile(50)),
            str(hist.get_value_at_percentile(99)),
            f"{mean:.0f}",
            f"{1e6 / mean:.0f}",
        )
    console.print(floor)
    alignment = "default" if journal_alignment is None else str(journal_alignment)
    table = Table(
        title=f"bookie adds ({durability}), {entry_size} B entries, {seconds:g} s per level, "
        f"journal alignment {alignment}"
    )
    columns = (
        "adds/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "fdatasync/s",
        "adds/sync",
        "journal B / payload B",
        "bookie CPU us/add",
    )
    for column in ("in flight", *columns):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.in_flight),
            f"{r.adds_per_s:.0f}",
            str(r.p50_us),
            str(r.p99_us),
            str(r.p999_us),
            f"{r.fdatasyncs_per_s:.0f}",
            f"{r.adds_per_fdatasync:.1f}",
            f"{r.journal_bytes_per_payload_byte:.2f}",
            f"{r.bookie_cpu_us_per_add:.0f}",
        )
    console.print(table)
    if paced:
        open_table = Table(title="open loop: latency from each add's intended send time")
        open_columns = ("from send p50 / p99 us", "send lag p99 us", "unfinished")
        for column in ("offered/s", *columns, *open_columns):
            open_table.add_column(column, justify="right")
        for p in paced:
            open_table.add_row(
                f"{p.offered_per_s:g}",
                f"{p.adds_per_s:.0f}",
                str(p.p50_us),
                str(p.p99_us),
                str(p.p999_us),
                f"{p.fdatasyncs_per_s:.0f}",
                f"{p.adds_per_fdatasync:.1f}",
                f"{p.journal_bytes_per_payload_byte:.2f}",
                f"{p.bookie_cpu_us_per_add:.0f}",
                f"{p.sent_p50_us} / {p.sent_p99_us}",
                str(p.send_lag_p99_us),
                str(p.unfinished),
            )
        console.print(open_table)
    checks = check_targets(results, sync_p50, sync_mean, rtt_p50)
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "entry_size": entry_size,
        "durability": durability,
        "seconds_per_level": seconds,
        "journal_alignment": journal_alignment,
        "floors": {
            "fdatasync_p50_us": sync_p50,
            "fdatasync_p99_us": sync.get_value_at_percentile(99),
            "fdatasync_mean_us": round(sync_mean, 1),
            "loopback_rtt_p50_us": rtt_p50,
            "loopback_rtt_p99_us": rtt.get_value_at_percentile(99),
        },
        "levels": [asdict(r) for r in results],
        "open_loop": [asdict(p) for p in paced],
        "checks": checks,
    }
    path = write_report("journal", report, json_path)
    console.print(f"wrote {path}")
    return report_checks(console, checks, fail_on_miss)


main = module_main(command, "journal")


if __name__ == "__main__":
    main()
