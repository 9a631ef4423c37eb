"""Client commands: ``aiobk simpletest`` and ``aiobk ledger read|recover|delete``; the helpers
every client command shares (``aiobk log`` is in ``client.log_cli``).

Reading never changes a ledger unless asked: ``ledger read`` opens without recovery and stops
at the LAC its bookies report, so a live writer keeps writing (BookKeeper's ``readledger``
recovers only with ``-r``); ``--recover`` and ``ledger recover`` fence and close. Deleting asks
first, on a terminal, unless ``--yes``; without a terminal to ask on it refuses.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import click
import uvloop
from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from aiobk.client.bookkeeper import BookKeeper, check_password
from aiobk.client.config import ClientConfig
from aiobk.client.entry import Entry
from aiobk.metadata import LedgerMetadata
from aiobk.metadata.cli import ledger_document, metadata_option, print_ledger_table
from aiobk.metadata.uri import MetadataURIError
from aiobk.protocol.errors import BKError

T = TypeVar("T")


def run_with_client(uri: str | None, action: Callable[[BookKeeper], Awaitable[T]]) -> T:
    """Connect, run ``action`` on uvloop, close; client errors become one-line errors."""
    if not uri:
        raise click.UsageError("--metadata (or AIOBK_METADATA) is required")

    async def main() -> T:
        async with BookKeeper(uri, ClientConfig()) as bk:
            return await action(bk)

    try:
        return uvloop.run(main())
    except MetadataURIError as exc:
        raise click.UsageError(str(exc)) from None
    except BKError as exc:
        raise click.ClickException(str(exc)) from None


@contextlib.contextmanager
def quiet_on_closed_pipe() -> Iterator[None]:
    """A reader that went away (``aiobk ledger read 7 | head -1``) ends the command quietly,
    status 0: what a consumer did not read was not wanted."""
    try:
        yield
    except BrokenPipeError:
        # Python flushes stdout once more at exit; that write would fail too and print
        # "Exception ignored ... BrokenPipeError". Point the descriptor at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def refuse_unless_confirmable(what: str, yes: bool) -> None:
    """Before any I/O: a destructive command without ``--yes`` needs a terminal to ask on
    (never a silent default, never a hang on a pipe)."""
    if not yes and not sys.stdin.isatty():
        raise click.UsageError(f"{what} needs confirmation and stdin is not a terminal; pass --yes")


def confirm_or_stop(question: str, refused: str) -> None:
    """Ask on the terminal (the question on stderr: stdout is for data); "no" stops."""
    if not click.confirm(question, default=False, err=True):
        raise click.ClickException(refused)


def entry_line(entry: Entry, as_json: bool, position: str | None = None) -> str:
    """One entry as printed: ``ID<TAB>DATA`` (UTF-8, other bytes escaped), or a JSON object
    with the data in base64; ``position`` (a log's ``LEDGER:ENTRY``) replaces the id."""
    if as_json:
        document: dict[str, Any] = {}
        if position is not None:
            document["position"] = position
            document["ledger_id"] = entry.ledger_id
        document["entry_id"] = entry.entry_id
        document["data_base64"] = base64.b64encode(entry.data).decode()
        return json.dumps(document)
    data = entry.data.decode("utf-8", errors="backslashreplace")
    return f"{entry.entry_id if position is None else position}\t{data}"


password_option = click.option(
    "--password", default="", help="The ledger's password (UTF-8).", show_default=False
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")


def read_command(group: click.Group) -> None:
    @group.command(
        "read",
        help="Print a ledger's entries, up to the last add confirmed its bookies report. "
        "Never fences: a live writer keeps writing (unless --recover).",
    )
    @click.argument("ledger_id", type=click.IntRange(min=0))
    @click.option("--from", "first", type=click.IntRange(min=0), default=0, help="First entry.")
    @click.option(
        "--to", "last", type=click.IntRange(min=0), default=None,
        help="Last entry, inclusive (default: the last add confirmed).",
    )  # fmt: skip
    @click.option(
        "--recover", is_flag=True,
        help="Fence, recover and close an open ledger first, then read to its end: its "
        "writer's next append fails.",
    )  # fmt: skip
    # Not fencing was opt-in before issue 13; the flag stays accepted so scripts keep working.
    @click.option("--no-recovery", is_flag=True, hidden=True)
    @password_option
    @metadata_option
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per entry.")
    def ledger_read(
        ledger_id: int,
        first: int,
        last: int | None,
        recover: bool,
        no_recovery: bool,
        password: str,
        metadata: str | None,
        as_json: bool,
    ) -> None:
        if last is not None and last < first:
            raise click.UsageError(f"--from {first} is after --to {last}")
        if recover and no_recovery:
            raise click.UsageError("--recover and --no-recovery contradict each other")

        async def action(bk: BookKeeper) -> None:
            rh = await bk.open_ledger(ledger_id, password.encode(), recovery=recover)
            lac = await rh.read_last_add_confirmed()  # asks the bookies of an open ledger
            if last is not None and last > lac:
                state = "closed" if rh.is_closed else "open"
                raise click.ClickException(
                    f"ledger {ledger_id}: --to {last} is past its last add confirmed ({lac}; "
                    f"the ledger is {state})"
                )
            end = lac if last is None else last
            if first > end:
                return
            # Streamed: each entry printed as it arrives, so the first line shows at once
            # and memory stays flat whatever the ledger's size.
            async with contextlib.aclosing(rh.read_iter(first, end)) as entries:
                async for entry in entries:
                    click.echo(entry_line(entry, as_json))

        with quiet_on_closed_pipe():
            run_with_client(metadata, action)


def recover_command(group: click.Group) -> None:
    @group.command("recover", help="Fence, recover and close a ledger; print its metadata.")
    @click.argument("ledger_id", type=click.IntRange(min=0))
    @password_option
    @metadata_option
    @json_option
    def ledger_recover(ledger_id: int, password: str, metadata: str | None, as_json: bool) -> None:
        async def action(bk: BookKeeper) -> LedgerMetadata:
            rh = await bk.open_ledger(ledger_id, password.encode(), recovery=True)
            return rh.metadata

        recovered = run_with_client(metadata, action)
        if as_json:
            click.echo(json.dumps(ledger_document(ledger_id, recovered)))
        else:
            print_ledger_table(ledger_id, recovered)


def delete_command(group: click.Group) -> None:
    @group.command(
        "delete",
        help="Delete a ledger's metadata (bookies reclaim its space later). Asks first "
        "unless --yes.",
    )
    @click.argument("ledger_id", type=click.IntRange(min=0))
    @yes_option
    @click.option(
        "--password", default=None,
        help="Delete only if this is the ledger's password (UTF-8).",
    )  # fmt: skip
    @metadata_option
    @json_option
    def ledger_delete(
        ledger_id: int, yes: bool, password: str | None, metadata: str | None, as_json: bool
    ) -> None:
        refuse_unless_confirmable(f"deleting ledger {ledger_id}", yes)
        secret = None if password is None else password.encode()
        if not yes:

            async def describe(bk: BookKeeper) -> str:
                found = await bk.store.read_ledger(ledger_id)
                if secret is not None:
                    check_password(ledger_id, found, secret)  # refused before asking
                last = found.last_entry_id
                if last is None:  # open: only its bookies know how far it goes
                    return found.state.value
                if last < 0:
                    return f"{found.state.value}, empty"
                return f"{found.state.value}, entries 0..{last}, {found.length} bytes"

            summary = run_with_client(metadata, describe)
            confirm_or_stop(
                f"Delete ledger {ledger_id} ({summary})?", f"ledger {ledger_id} not deleted"
            )
        run_with_client(metadata, lambda bk: bk.delete_ledger(ledger_id, secret))
        if as_json:
            click.echo(json.dumps({"ledger_id": ledger_id, "deleted": True}))
        else:
            click.echo(f"deleted ledger {ledger_id}")


def add_ledger_commands(group: click.Group) -> None:
    read_command(group)
    recover_command(group)
    delete_command(group)


# ---------------------------------------------------------------------- simpletest


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
@click.option("--ensemble", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--write-quorum", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--ack-quorum", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--entries", type=click.IntRange(min=1, max=10_000_000), default=1000, show_default=True
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
