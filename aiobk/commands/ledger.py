"""``aiobk ledger list|show|read|recover|delete``.

Reading never changes a ledger unless asked: ``ledger read`` opens without recovery and stops
at the LAC its bookies report, so a live writer keeps writing (BookKeeper's ``readledger``
recovers only with ``-r``); ``--recover`` and ``ledger recover`` fence and close. Deleting asks
first, on a terminal, unless ``--yes``; without a terminal to ask on it refuses. Deleting a
ledger that has a password takes ``--password``, or ``--no-password-check`` from an
operator: on this path, which writes the metadata store directly, the store's own access
control is the admin role (a bookie's roles come from TLS certificates, which etcd never sees).
"""

from __future__ import annotations

import contextlib
import json

import click

from aiobk.client.bookkeeper import BookKeeper
from aiobk.client.log import format as log_format
from aiobk.client.passwords import check_delete
from aiobk.commands.common import (
    confirm_or_stop,
    json_option,
    ledger_document,
    metadata_option,
    password_option,
    print_ledger_table,
    quiet_on_closed_pipe,
    refuse_unless_confirmable,
    require_metadata,
    run_with_client,
    run_with_store,
    yes_option,
)
from aiobk.commands.records import entry_line
from aiobk.metadata import LedgerMetadata
from aiobk.metadata.store import MetadataStore
from aiobk.protocol.errors import NoSuchLogError
from aiobk.protocol.keys import password_matches


@click.group(name="ledger", help="Inspect and manage ledgers.")
def ledger_group() -> None:
    pass


@ledger_group.command("list", help="List ledger ids, ascending (streamed page by page).")
@metadata_option
@json_option
def ledger_list(metadata: str | None, as_json: bool) -> None:
    async def collect(store: MetadataStore) -> list[int]:
        return [ledger_id async for ledger_id in store.list_ledgers()]

    ids = run_with_store(metadata, collect)
    if as_json:
        click.echo(json.dumps(ids))
    else:
        for ledger_id in ids:
            click.echo(ledger_id)


@ledger_group.command("show", help="Show one ledger's metadata.")
@click.argument("ledger_id", type=click.IntRange(min=0))
@metadata_option
@json_option
def ledger_show(ledger_id: int, metadata: str | None, as_json: bool) -> None:
    found = run_with_store(metadata, lambda store: store.read_ledger(ledger_id))
    if as_json:
        click.echo(json.dumps(ledger_document(ledger_id, found)))
    else:
        print_ledger_table(ledger_id, found)


def read_command(group: click.Group) -> None:
    @group.command(
        "read",
        help="Print a ledger's entries, up to the last add confirmed its bookies report, one a "
        "line: ID<TAB>DATA, or for a ledger of a log of records with a key, headers and a time, "
        "ID<TAB>TIME<TAB>KEY<TAB>HEADERS<TAB>DATA (UTF-8; other bytes and control characters "
        "backslash-escaped). Never fences: a live writer keeps writing (unless --recover).",
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
    # ``ledger read`` used to fence unless given this; it stays accepted so scripts keep working.
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
            envelopes = await holds_envelopes(bk.store, rh.metadata)
            # Streamed: each entry printed as it arrives, so the first line shows at once
            # and memory stays flat whatever the ledger's size.
            async with contextlib.aclosing(rh.read_iter(first, end)) as entries:
                async for entry in entries:
                    record = None
                    if envelopes:
                        try:
                            record = log_format.decode(entry.data)
                        except log_format.RecordFormatError as exc:
                            click.echo(
                                f"aiobk: entry {entry.entry_id} is no record ({exc}); "
                                "shown as stored",
                                err=True,
                            )
                    click.echo(entry_line(entry.entry_id, entry.data, as_json, record))

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
        "unless --yes. A ledger with a password is deleted only with --password (checked "
        "against the digest in its metadata) or --no-password-check.",
    )
    @click.argument("ledger_id", type=click.IntRange(min=0))
    @yes_option
    @click.option(
        "--password", default=None,
        help="The ledger's password (UTF-8); required for a ledger that has one.",
    )  # fmt: skip
    @click.option(
        "--no-password-check", is_flag=True,
        help="Delete without the password: for an operator whose credentials to the metadata "
        "store already allow it (etcd's roles on the prefix are the barrier there; this check "
        "only keeps a client that knows the wrong password from deleting).",
    )  # fmt: skip
    @metadata_option
    @json_option
    def ledger_delete(
        ledger_id: int,
        yes: bool,
        password: str | None,
        no_password_check: bool,
        metadata: str | None,
        as_json: bool,
    ) -> None:
        if password is not None and no_password_check:
            raise click.UsageError("--password and --no-password-check contradict each other")
        require_metadata(metadata)
        refuse_unless_confirmable(f"deleting ledger {ledger_id}", yes)
        # A ledger created with the empty password needs none given (BookKeeper.delete_ledger).
        secret = None if password is None else password.encode()

        async def describe(bk: BookKeeper) -> str:
            found = await bk.store.read_ledger(ledger_id)
            if not no_password_check:  # refused before asking
                if password is None and not has_empty_password(found):
                    raise click.ClickException(
                        f"ledger {ledger_id} has a password: pass --password (or "
                        "--no-password-check, as an operator the metadata store lets delete)"
                    )
                check_delete(ledger_id, found, secret)
            last = found.last_entry_id
            if last is None:  # open: only its bookies know how far it goes
                return found.state.value
            if last < 0:
                return f"{found.state.value}, empty"
            return f"{found.state.value}, entries 0..{last}, {found.length} bytes"

        summary = run_with_client(metadata, describe)
        if not yes:
            confirm_or_stop(
                f"Delete ledger {ledger_id} ({summary})?", f"ledger {ledger_id} not deleted"
            )
        run_with_client(
            metadata, lambda bk: bk.delete_ledger(ledger_id, secret, force=no_password_check)
        )
        if as_json:
            click.echo(json.dumps({"ledger_id": ledger_id, "deleted": True}))
        else:
            click.echo(f"deleted ledger {ledger_id}")


async def holds_envelopes(store: MetadataStore, metadata: LedgerMetadata) -> bool:
    """Whether the ledger's entries are records with a key, headers and a time: it was written
    for a log (its custom metadata names it) whose records are envelopes."""
    name = metadata.custom_metadata.get("log")
    if name is None:
        return False
    try:
        found = await store.read_log(name.decode(errors="replace"))
    except (NoSuchLogError, ValueError):  # gone, or no name a log can have
        return False
    return found.record_format == log_format.ENVELOPE


def has_empty_password(metadata: LedgerMetadata) -> bool:
    """Whether the ledger was created with the empty password (the default)."""
    return password_matches(metadata.password_salt, metadata.password_digest, b"")


def add_ledger_commands(group: click.Group) -> None:
    read_command(group)
    recover_command(group)
    delete_command(group)


add_ledger_commands(ledger_group)
