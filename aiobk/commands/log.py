"""``aiobk log list|show|tail|truncate|delete``: logs from the command line.

Positions are printed and taken as ``LEDGER:ENTRY`` (``LogPosition``'s text form), or
``earliest``. ``tail`` reads to the end of the log as it is when it starts and exits; with
``--follow`` it keeps printing live appends until interrupted (Ctrl-C exits 0). Nothing here
fences: reading a log never disturbs its writer.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from aiobk.client.bookkeeper import BookKeeper
from aiobk.client.log.position import LogPosition
from aiobk.commands.common import (
    confirm_or_stop,
    delete_password_options,
    json_option,
    metadata_option,
    quiet_on_closed_pipe,
    refuse_unless_confirmable,
    require_metadata,
    run_with_client,
    run_with_store,
    until_signalled,
    yes_option,
)
from aiobk.commands.records import record_line
from aiobk.metadata import KeyLayout, LogMetadata, MetadataStore
from aiobk.protocol.errors import NoSuchLedgerError


def _position(ctx: click.Context, param: click.Parameter, value: str | None) -> LogPosition | None:
    """A ``LogPosition`` on the command line: ``LEDGER:ENTRY`` or ``earliest``."""
    if value is None:
        return None
    try:
        return LogPosition.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _log_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A log name the store accepts, checked before connecting."""
    try:
        KeyLayout("aiobk").log(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return value


name_argument = click.argument("name", callback=_log_name)


@click.group(name="log", help="Inspect, read and manage logs (ordered lists of ledgers).")
def log_group() -> None:
    pass


@log_group.command("list", help="List log names, in order.")
@metadata_option
@json_option
def log_list(metadata: str | None, as_json: bool) -> None:
    async def collect(store: MetadataStore) -> list[str]:
        return [name async for name in store.list_logs()]

    names = run_with_store(metadata, collect)
    if as_json:
        click.echo(json.dumps(names))
    else:
        for name in names:
            click.echo(name)


async def _log_document(store: MetadataStore, record: LogMetadata) -> dict[str, Any]:
    ledgers: list[dict[str, Any]] = []
    for ledger_id in record.ledgers:
        try:
            found = await store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            ledgers.append({"ledger_id": ledger_id, "state": "MISSING"})
            continue
        ledgers.append(
            {
                "ledger_id": ledger_id,
                "state": found.state.value,
                "last_entry_id": found.last_entry_id,
                "length": found.length,
            }
        )
    return {
        "name": record.name,
        "version": record.version,
        "record_format": record.record_format,
        "ledgers": ledgers,
    }


@log_group.command("show", help="Show a log's ledgers (metadata only: no bookie is asked).")
@name_argument
@metadata_option
@json_option
def log_show(name: str, metadata: str | None, as_json: bool) -> None:
    async def collect(store: MetadataStore) -> dict[str, Any]:
        return await _log_document(store, await store.read_log(name))

    document = run_with_store(metadata, collect)
    if as_json:
        click.echo(json.dumps(document))
        return
    click.echo(
        f"log {name}: {len(document['ledgers'])} ledgers, {document['record_format']} records"
    )
    for ledger in document["ledgers"]:
        if ledger["state"] == "CLOSED":
            count = ledger["last_entry_id"] + 1
            click.echo(
                f"  {ledger['ledger_id']}\tCLOSED\t{count} entries\t{ledger['length']} bytes"
            )
        else:
            click.echo(f"  {ledger['ledger_id']}\t{ledger['state']}")


@log_group.command(
    "tail",
    help="Print a log's records from --from to the end the log has now, one a line: "
    "POSITION<TAB>DATA, or POSITION<TAB>TIME<TAB>KEY<TAB>HEADERS<TAB>DATA for records with a "
    "key, headers and a time (UTF-8; other bytes and control characters backslash-escaped). "
    "With --follow, keep printing live appends until interrupted.",
)
@name_argument
@click.option(
    "--from", "start", metavar="POSITION", callback=_position, default="earliest",
    show_default=True,
    help="First position to print: LEDGER:ENTRY or earliest.",
)  # fmt: skip
@click.option("--follow", "-f", is_flag=True, help="Tail live appends until interrupted.")
@click.option("--password", default="", help="The log's ledgers' password (UTF-8).")
@metadata_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per record.")
def log_tail(
    name: str, start: LogPosition, follow: bool, password: str, metadata: str | None, as_json: bool
) -> None:
    async def action(bk: BookKeeper) -> None:
        reader = await bk.open_log_reader(name, start, password.encode(), follow=follow)

        async def show() -> None:
            async for record in reader:
                click.echo(record_line(record, as_json))
                if follow:
                    sys.stdout.flush()  # live: each record as it comes, not a buffer later

        if follow:
            await until_signalled(show())  # Ctrl-C or SIGTERM: the client closes, status 0
        else:
            await show()

    with quiet_on_closed_pipe():
        try:
            run_with_client(metadata, action)
        except KeyboardInterrupt:
            if not follow:
                raise
            # Ctrl-C while the follow was starting: how a follow ends, not an error.


@log_group.command(
    "truncate",
    help="Delete the log's ledgers wholly below POSITION (never its last ledger).",
)
@name_argument
@click.option(
    "--before", metavar="POSITION", callback=_position, required=True,
    help="Keep the ledger holding this position and every later one (LEDGER:ENTRY).",
)  # fmt: skip
@delete_password_options
@metadata_option
@json_option
def log_truncate(
    name: str,
    before: LogPosition,
    password: bytes | None,
    force: bool,
    metadata: str | None,
    as_json: bool,
) -> None:
    deleted = run_with_client(
        metadata, lambda bk: bk.truncate_log(name, before, password, force=force)
    )
    if as_json:
        click.echo(json.dumps({"name": name, "before": str(before), "deleted_ledgers": deleted}))
    elif deleted:
        click.echo(f"log {name}: deleted ledgers {', '.join(map(str, deleted))}")
    else:
        click.echo(f"log {name}: no ledger wholly below {before}")


@log_group.command("delete", help="Delete a log and all its ledgers. Asks first unless --yes.")
@name_argument
@yes_option
@delete_password_options
@metadata_option
@json_option
def log_delete(
    name: str,
    yes: bool,
    password: bytes | None,
    force: bool,
    metadata: str | None,
    as_json: bool,
) -> None:
    require_metadata(metadata)
    refuse_unless_confirmable(f"deleting log {name}", yes)
    if not yes:
        record = run_with_store(metadata, lambda store: store.read_log(name))
        ledgers = ", ".join(map(str, record.ledgers)) or "none"
        confirm_or_stop(
            f"Delete log {name} and its {len(record.ledgers)} ledgers ({ledgers})?",
            f"log {name} not deleted",
        )
    deleted = run_with_client(metadata, lambda bk: bk.delete_log(name, password, force=force))
    if as_json:
        click.echo(json.dumps({"name": name, "deleted_ledgers": deleted}))
    else:
        click.echo(f"deleted log {name} and ledgers {', '.join(map(str, deleted)) or 'none'}")
