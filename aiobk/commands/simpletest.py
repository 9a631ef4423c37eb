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

from aiobk.client.bookkeeper import BookKeeper
from aiobk.commands.common import metadata_option, run_with_client
from aiobk.commands.text import progress_line


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
    show_default=True, help="Payload bytes (at least 10: each starts with its number).",
)  # fmt: skip
@metadata_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def simpletest_command(
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    entries: int,
    entry_size: int,
    metadata: str | None,
    as_json: bool,
) -> None:
    if not ensemble >= write_quorum >= ack_quorum:
        raise click.UsageError("need --ensemble >= --write-quorum >= --ack-quorum")
    size = max(entry_size, 10)  # room for the entry's number, which the check reads back
    latency = Latencies()

    async def action(bk: BookKeeper) -> dict[str, Any]:
        def payload(i: int) -> bytes:
            return (b"%010d" % i).ljust(size, b".")

        async def timed_append(data: bytes) -> None:
            started = time.perf_counter_ns()
            await lh.append(data)
            latency.record(max(1, (time.perf_counter_ns() - started) // 1000))

        with contextlib.ExitStack() as stack:
            progress = progress_line()
            if progress is not None:
                stack.enter_context(progress)
                progress.show(f"appending 0/{entries}", now=True)
            lh = await bk.create_ledger(ensemble, write_quorum, ack_quorum)
            started = time.perf_counter()
            window = 512
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
            read = time.perf_counter() - started
        return {
            "ledger_id": lh.ledger_id,
            "entries": entries,
            "entry_size": size,
            "ensemble": ensemble,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "write_seconds": round(written, 3),
            "appends_per_second": round(entries / written, 1),
            "append_latency_ms": {
                name: round(latency.percentile(p) / 1000, 3)
                for name, p in (("p50", 50.0), ("p99", 99.0), ("max", 100.0))
            },
            "read_seconds": round(read, 3),
            "reads_per_second": round(entries / read, 1),
            "verified": True,
        }

    summary = run_with_client(metadata, action)
    if as_json:
        click.echo(json.dumps(summary))
        return
    ms = summary["append_latency_ms"]
    click.echo(
        f"ledger {summary['ledger_id']}: wrote {entries} entries of {size} bytes in "
        f"{summary['write_seconds']:.2f}s ({summary['appends_per_second']:.0f} appends/s, "
        f"latency p50 {ms['p50']:.2f} ms, p99 {ms['p99']:.2f} ms), read them back in "
        f"{summary['read_seconds']:.2f}s ({summary['reads_per_second']:.0f}/s); all verified"
    )
