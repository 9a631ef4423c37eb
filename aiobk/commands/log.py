"""``aiobk log list|show|tail|truncate|delete|offload|offload-policy``: logs from the command
line.

Positions are printed and taken as ``LEDGER:ENTRY`` (``LogPosition``'s text form), or
``earliest``. ``tail`` reads to the end of the log as it is when it starts and exits; with
``--follow`` it keeps printing live appends until interrupted (Ctrl-C exits 0). Nothing here
fences: reading a log never disturbs its writer. ``offload`` copies a log's closed ledgers to
the cluster's object store now; ``offload-policy`` says which ones the autorecovery leader
copies on its own (``aiobk.commands.offload`` has the store and the sweep).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from aiobk.client.bookkeeper import BookKeeper
from aiobk.client.log.position import LogPosition
from aiobk.client.offload import OffloadReport
from aiobk.commands.common import (
    confirm_or_stop,
    delete_password_options,
    json_option,
    metadata_option,
    parse_duration,
    parse_size,
    quiet_on_closed_pipe,
    refuse_unless_confirmable,
    require_metadata,
    run_with_client,
    run_with_store,
    until_signalled,
    yes_option,
)
from aiobk.commands.offload import offload_log_paused, pause_point, print_report, report_document
from aiobk.commands.records import record_line
from aiobk.commands.text import echo_table, format_duration, format_size
from aiobk.metadata import KeyLayout, LogMetadata, MetadataStore, OffloadPolicy
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


@log_group.command(
    "offload",
    help="Copy the log's closed ledgers (those wholly before --before, or all of them) into "
    "the cluster's object store (`aiobk offload store`), each as one object read back and "
    "checked before its metadata records it. Readers then read them from the store, with "
    "or without their bookies; the bookies drop their copies once the store's deletion lag "
    "has passed. Ledgers offloaded before, and the open ledger, are left as they are.",
)
@name_argument
@click.option(
    "--before", metavar="POSITION", callback=_position, default=None,
    help="Keep the ledger holding this position and every later one on the bookies only "
    "(LEDGER:ENTRY).",
)  # fmt: skip
@click.option(
    "--password", default=None,
    help="The log's ledgers' password (UTF-8), to check every entry's digest on the way "
    "(without it, entries of a ledger with a password are checked by their ids and CRCs).",
)  # fmt: skip
@metadata_option
@json_option
def log_offload(
    name: str, before: LogPosition | None, password: str | None, metadata: str | None, as_json: bool
) -> None:
    point = pause_point()
    secret = None if password is None else password.encode()

    async def action(bk: BookKeeper) -> OffloadReport:
        if point is not None:
            return await offload_log_paused(bk, name, before, secret, point)
        return await bk.offload_log(name, before, secret)

    try:
        report = run_with_client(metadata, action)
    except ValueError as exc:  # --before names no ledger of the log
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report_document(report)))
    else:
        print_report(report)


def _policy_document(name: str, policy: OffloadPolicy | None) -> dict[str, Any]:
    return {"name": name, "offload_policy": None if policy is None else policy.to_dict()}


@log_group.command(
    "offload-policy",
    help="Show the log's offload policy, or set it: the autorecovery leader then offloads "
    "its closed ledgers older than --older-than (since the roll that closed them) and those "
    "beyond the newest --beyond bytes of the log. The rules given make the whole policy; "
    "--clear turns offloading off.",
)
@name_argument
@click.option(
    "--older-than", callback=parse_duration, default=None, metavar="DURATION",
    help="Offload ledgers closed longer ago than this (90s, 30m, 4h, 7d).",
)  # fmt: skip
@click.option(
    "--beyond", callback=parse_size, default=None, metavar="SIZE",
    help="Offload ledgers beyond the newest SIZE of the log (bytes, or 512MiB, 10GiB...).",
)  # fmt: skip
@click.option("--clear", is_flag=True, help="Remove the policy: no ledger is offloaded on its own.")
@metadata_option
@json_option
def log_offload_policy(
    name: str,
    older_than: float | None,
    beyond: int | None,
    clear: bool,
    metadata: str | None,
    as_json: bool,
) -> None:
    ruled = older_than is not None or beyond is not None
    if clear and ruled:
        raise click.UsageError("--clear takes no --older-than or --beyond")

    async def action(store: MetadataStore) -> OffloadPolicy | None:
        if clear:
            return (await store.set_offload_policy(name, None)).offload_policy
        if ruled:
            policy = OffloadPolicy(older_than=older_than, beyond_bytes=beyond)
            return (await store.set_offload_policy(name, policy)).offload_policy
        return (await store.read_log(name)).offload_policy

    policy = run_with_store(metadata, action)
    if as_json:
        click.echo(json.dumps(_policy_document(name, policy)))
    elif policy is None:
        click.echo(f"log {name}: no offload policy")
    else:
        older = "-" if policy.older_than is None else format_duration(policy.older_than)
        beyond_text = (
            "-"
            if policy.beyond_bytes is None
            else f"{policy.beyond_bytes} bytes ({format_size(policy.beyond_bytes)})"
        )
        echo_table([("log", name), ("offload older than", older), ("offload beyond", beyond_text)])
