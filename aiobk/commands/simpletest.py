"""``aiobk simpletest``: write entries to a new ledger, read them back, verify, and report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import Counter
from typing import Any

import click

from aiobk.client import Durability, LedgerHandle
from aiobk.client.bookkeeper import BookKeeper
from aiobk.commands.common import metadata_option, run_with_client
from aiobk.commands.text import ProgressLine, progress_line
from aiobk.protocol.errors import BKError


class Latencies:
    """Latencies in whole microseconds, each kept rounded up to three significant digits (as
    an HdrHistogram of that precision keeps them): memory grows with the distinct values, a
    few thousand at most, not with --entries."""

    def __init__(self) -> None:
        self._counts: Counter[int] = Counter()
        self._total = 0

    def record(self, micros: int) -> None:
        scale = 10 ** max(0, len(str(micros)) - 3)
        self._counts[-(-micros // scale) * scale] += 1
        self._total += 1

    def percentile(self, percent: float) -> int:
        """The least recorded value that ``percent`` of the values are at or below (0: none)."""
        rank = max(1, math.ceil(percent / 100 * self._total))
        seen = 0
        for value in sorted(self._counts):
            seen += self._counts[value]
            if seen >= rank:
                return value
        return 0


@click.command(
    "simpletest",
    help="Write entries to a new ledger, read them back, verify, and report appends/s and "
    "append latency (its progress on a terminal).",
)
@click.option(
    "--ensemble", type=click.IntRange(min=1), default=3, show_default=True, help="Ensemble size."
)
@click.option(
    "--write-quorum", type=click.IntRange(min=1), default=3, show_default=True, help="Copies."
)
@click.option(
    "--ack-quorum",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Copies that acknowledge an entry.",
)
@click.option(
    "--entries",
    type=click.IntRange(min=1, max=10_000_000),
    default=1000,
    show_default=True,
    help="Entries to write, read back and verify.",
)
@click.option(
    "--entry-size", type=click.IntRange(min=0, max=4 * 1024 * 1024), default=1024,
    show_default=True,
    help="Payload bytes, exactly (each starts with as much of its number as fits).",
)  # fmt: skip
@click.option(
    "--in-flight", type=click.IntRange(min=1, max=100_000), default=512, show_default=True,
    help="Appends kept in flight at once.",
)  # fmt: skip
@click.option(
    "--durability", type=click.Choice(["persistent", "volatile"]), default="persistent",
    show_default=True,
    help="persistent: confirmed once fsynced on the ack quorum; volatile (BP-14): once written.",
)  # fmt: skip
@click.option("--keep", is_flag=True, help="Keep the ledger (by default it is deleted at the end).")
@metadata_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def simpletest_command(
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    entries: int,
    entry_size: int,
    in_flight: int,
    durability: str,
    keep: bool,
    metadata: str | None,
    as_json: bool,
) -> None:
    if not ensemble >= write_quorum >= ack_quorum:
        raise click.UsageError("need --ensemble >= --write-quorum >= --ack-quorum")
    size = entry_size
    latency = Latencies()  # from the append call to its confirmation
    waited = Latencies()  # before the call: waiting for one of the --in-flight slots

    def payload(i: int) -> bytes:
        return (b"%010d" % i).ljust(size, b".")[:size]

    async def write_and_check(
        bk: BookKeeper, lh: LedgerHandle, progress: ProgressLine | None
    ) -> tuple[float, float]:
        slots = asyncio.Semaphore(in_flight)

        async def timed_append(data: bytes) -> None:
            queued = time.perf_counter_ns()
            async with slots:
                started = time.perf_counter_ns()
                waited.record(max(1, (started - queued) // 1000))
                await lh.append(data)
                latency.record(max(1, (time.perf_counter_ns() - started) // 1000))

        started = time.perf_counter()
        # Appends wait for one of the --in-flight slots: the window slides (a slow entry holds
        # one slot, not a whole batch); a few thousand tasks exist at a time.
        window = max(in_flight, 4096)
        for start in range(0, entries, window):
            stop = min(start + window, entries)
            await asyncio.gather(*(timed_append(payload(i)) for i in range(start, stop)))
            if progress is not None:
                progress.show(f"appending {stop}/{entries}")
        written = time.perf_counter() - started
        await lh.close()
        if progress is not None:
            progress.show(f"reading back 0/{entries}", now=True)
        started = time.perf_counter()
        rh = await bk.open_ledger(lh.ledger_id)
        count = 0
        async with contextlib.aclosing(rh.read_iter(0, entries - 1)) as got:
            async for entry in got:  # streamed: read() would refuse past max_read_bytes
                if entry.entry_id != count or entry.data != payload(count):
                    raise click.ClickException(
                        f"ledger {lh.ledger_id}: entry {entry.entry_id} read back differs"
                    )
                count += 1
                if progress is not None and count % 512 == 0:
                    progress.show(f"reading back {count}/{entries}")
        if count != entries:
            raise click.ClickException(f"ledger {lh.ledger_id}: read back {count} of {entries}")
        return written, time.perf_counter() - started

    async def action(bk: BookKeeper) -> dict[str, Any]:
        with contextlib.ExitStack() as stack:
            progress = progress_line()
            if progress is not None:
                stack.enter_context(progress)
                progress.show(f"appending 0/{entries}", now=True)
            lh = await bk.create_ledger(
                ensemble, write_quorum, ack_quorum, durability=Durability[durability.upper()]
            )
            try:
                written, read = await write_and_check(bk, lh, progress)
            finally:
                if not keep:  # a test run leaves nothing behind
                    with contextlib.suppress(BKError):
                        await lh.close()
                    await bk.delete_ledger(lh.ledger_id)
        return {
            "ledger_id": lh.ledger_id,
            "kept": keep,
            "entries": entries,
            "entry_size": size,
            "ensemble": ensemble,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "in_flight": in_flight,
            "durability": durability,
            "write_seconds": round(written, 3),
            "appends_per_second": round(entries / written, 1),
            # From the append call to its confirmation (the time waiting for a slot apart).
            "append_latency_ms": _percentiles(latency),
            "slot_wait_ms": _percentiles(waited),
            "read_seconds": round(read, 3),
            "reads_per_second": round(entries / read, 1),
            "verified": True,
        }

    summary = run_with_client(metadata, action)
    if as_json:
        click.echo(json.dumps(summary))
        return
    ms, wait = summary["append_latency_ms"], summary["slot_wait_ms"]
    kept = "kept" if keep else "deleted"
    click.echo(
        f"ledger {summary['ledger_id']} ({kept}): wrote {entries} entries of {size} bytes, "
        f"{in_flight} in flight, {durability}, in {summary['write_seconds']:.2f}s "
        f"({summary['appends_per_second']:.0f} appends/s); append latency (call to "
        f"confirmation) p50 {ms['p50']:.2f} ms, p99 {ms['p99']:.2f} ms; waited for an "
        f"in-flight slot p50 {wait['p50']:.2f} ms; read them back in "
        f"{summary['read_seconds']:.2f}s ({summary['reads_per_second']:.0f}/s); all verified"
    )


def _percentiles(latencies: Latencies) -> dict[str, float]:
    return {
        name: round(latencies.percentile(p) / 1000, 3)
        for name, p in (("p50", 50.0), ("p99", 99.0), ("max", 100.0))
    }
