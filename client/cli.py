"""Client commands: ``aiobk simpletest`` and ``aiobk ledger read|recover|delete``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
import uvloop

from client.bookkeeper import BookKeeper
from client.config import ClientConfig
from metadata.cli import ledger_document, metadata_option
from metadata.uri import MetadataURIError
from protocol.errors import BKError

T = TypeVar("T")


def run_with_client(uri: str | None, action: Callable[[BookKeeper], Awaitable[T]]) -> T:
    if not uri:
        raise click.UsageError("--metadata (or AIOBK_METADATA) is required")

    async def main() -> T:
        async with await BookKeeper.connect(uri, ClientConfig()) as bk:
            return await action(bk)

    try:
        return uvloop.run(main())
    except MetadataURIError as exc:
        raise click.UsageError(str(exc)) from None
    except BKError as exc:
        raise click.ClickException(str(exc)) from None


password_option = click.option(
    "--password", default="", help="The ledger's password (UTF-8).", show_default=False
)


def read_command(group: click.Group) -> None:
    @group.command("read", help="Print a ledger's entries (up to its last add confirmed).")
    @click.argument("ledger_id", type=click.IntRange(min=0))
    @click.option("--from", "first", type=click.IntRange(min=0), default=0)
    @click.option("--to", "last", type=click.IntRange(min=0), default=None)
    @click.option("--no-recovery", is_flag=True, help="Do not fence or close an open ledger.")
    @password_option
    @metadata_option
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per entry.")
    def ledger_read(
        ledger_id: int,
        first: int,
        last: int | None,
        no_recovery: bool,
        password: str,
        metadata: str | None,
        as_json: bool,
    ) -> None:
        async def action(bk: BookKeeper) -> None:
            rh = await bk.open_ledger(ledger_id, password.encode(), recovery=not no_recovery)
            end = rh.last_add_confirmed if last is None else last
            if end < first:
                return
            # Streamed: printed as read, so a ledger of any size prints in flat memory.
            async with contextlib.aclosing(rh.read_iter(first, end)) as entries:
                async for entry in entries:
                    if as_json:
                        text = base64.b64encode(entry.data).decode()
                        click.echo(json.dumps({"entry_id": entry.entry_id, "data_base64": text}))
                    else:
                        data = entry.data.decode("utf-8", errors="backslashreplace")
                        click.echo(f"{entry.entry_id}\t{data}")

        run_with_client(metadata, action)


def recover_command(group: click.Group) -> None:
    @group.command("recover", help="Fence, recover and close a ledger; print its metadata.")
    @click.argument("ledger_id", type=click.IntRange(min=0))
    @password_option
    @metadata_option
    def ledger_recover(ledger_id: int, password: str, metadata: str | None) -> None:
        async def action(bk: BookKeeper) -> dict[str, object]:
            rh = await bk.open_ledger(ledger_id, password.encode(), recovery=True)
            return ledger_document(ledger_id, rh.metadata)

        click.echo(json.dumps(run_with_client(metadata, action)))


def delete_command(group: click.Group) -> None:
    @group.command("delete", help="Delete a ledger's metadata (bookies reclaim space later).")
    @click.argument("ledger_id", type=click.IntRange(min=0))
    @metadata_option
    def ledger_delete(ledger_id: int, metadata: str | None) -> None:
        run_with_client(metadata, lambda bk: bk.delete_ledger(ledger_id))
        click.echo(f"deleted ledger {ledger_id}")


def add_ledger_commands(group: click.Group) -> None:
    read_command(group)
    recover_command(group)
    delete_command(group)


@click.command("simpletest", help="Write entries to a new ledger, read them back, report.")
@click.option("--ensemble", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--write-quorum", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--ack-quorum", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--entries", type=click.IntRange(min=1, max=10_000_000), default=1000)
@click.option("--entry-size", type=click.IntRange(min=0, max=4 * 1024 * 1024), default=1024)
@metadata_option
def simpletest_command(
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    entries: int,
    entry_size: int,
    metadata: str | None,
) -> None:
    if not ensemble >= write_quorum >= ack_quorum:
        raise click.UsageError("need --ensemble >= --write-quorum >= --ack-quorum")

    async def action(bk: BookKeeper) -> tuple[int, float, float]:
        size = max(entry_size, 10)
        payloads = [(b"%010d" % i).ljust(size, b".") for i in range(entries)]
        lh = await bk.create_ledger(ensemble, write_quorum, ack_quorum)
        started = time.perf_counter()
        window = 512
        for start in range(0, entries, window):
            batch = payloads[start : start + window]
            await asyncio.gather(*(lh.append(p) for p in batch))
        written = time.perf_counter() - started
        await lh.close()
        started = time.perf_counter()
        rh = await bk.open_ledger(lh.ledger_id)
        count = 0
        async with contextlib.aclosing(rh.read_iter(0, entries - 1)) as got:
            async for entry in got:  # streamed: read() would refuse past max_read_bytes
                if entry.entry_id != count or entry.data != payloads[count]:
                    raise click.ClickException(
                        f"ledger {lh.ledger_id}: entry {entry.entry_id} read back differs"
                    )
                count += 1
        if count != entries:
            raise click.ClickException(f"ledger {lh.ledger_id}: read back {count} of {entries}")
        read = time.perf_counter() - started
        return lh.ledger_id, written, read

    ledger_id, written, read = run_with_client(metadata, action)
    click.echo(
        f"ledger {ledger_id}: wrote {entries} entries in {written:.2f}s "
        f"({entries / written:.0f}/s), read them back in {read:.2f}s; all verified"
    )
