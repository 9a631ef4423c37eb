"""``aiobk simpletest``: write entries to a new ledger, read them back, verify, and report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import click
from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from aiobk.client.bookkeeper import BookKeeper
from aiobk.commands.common import metadata_option, run_with_client


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,  # the bar goes; the summary line stays
    )


@click.command(
    "simpletest",
    help="Write entries to a new ledger, read them back, verify, and report appends/s and "
    "append latency (a progress bar on a terminal).",
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
    console = Console(stderr=True)
    # Microseconds, 1 us .. 10 min at 3 significant digits: flat memory at any --entries.
    latency = HdrHistogram(1, 600_000_000, 3)

    async def action(bk: BookKeeper) -> dict[str, Any]:
        def payload(i: int) -> bytes:
            return (b"%010d" % i).ljust(size, b".")

        async def timed_append(data: bytes) -> None:
            started = time.perf_counter_ns()
            await lh.append(data)
            latency.record_value(max(1, (time.perf_counter_ns() - started) // 1000))

        with contextlib.ExitStack() as stack:
            progress = stack.enter_context(_progress(console)) if console.is_terminal else None
            lh = await bk.create_ledger(ensemble, write_quorum, ack_quorum)
            task = progress.add_task("appending", total=entries) if progress else None
            started = time.perf_counter()
            window = 512
            for start in range(0, entries, window):
                stop = min(start + window, entries)
                await asyncio.gather(*(timed_append(payload(i)) for i in range(start, stop)))
                if progress is not None and task is not None:
                    progress.update(task, completed=stop)
            written = time.perf_counter() - started
            await lh.close()
            if progress is not None and task is not None:
                progress.remove_task(task)
            task = progress.add_task("reading back", total=entries) if progress else None
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
                    if progress is not None and task is not None and count % 512 == 0:
                        progress.update(task, completed=count)
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
                name: round(latency.get_value_at_percentile(p) / 1000, 3)
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
