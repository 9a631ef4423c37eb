"""``aiobk bookies list`` and ``aiobk ledger list|show``: human tables, ``--json`` for scripts."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import uvloop
from rich.console import Console
from rich.table import Table

from aiobk.metadata.model import LedgerMetadata, MetadataFormatError
from aiobk.metadata.store import MetadataStore
from aiobk.metadata.uri import MetadataURIError, open_store
from aiobk.protocol.errors import BKError

T = TypeVar("T")

metadata_option = click.option(
    "--metadata",
    envvar="AIOBK_METADATA",
    default=None,
    help="Metadata service URI (etcd://HOST:PORT/PREFIX); or set AIOBK_METADATA.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def run_with_store(uri: str | None, action: Callable[[MetadataStore], Awaitable[T]]) -> T:
    """Open the store, run ``action`` on uvloop, close; store errors become one-line errors."""
    if not uri:
        raise click.UsageError("--metadata (or AIOBK_METADATA) is required")

    async def main() -> T:
        store = open_store(uri)
        try:
            return await action(store)
        finally:
            await store.close()

    try:
        return uvloop.run(main())
    except MetadataURIError as exc:
        raise click.UsageError(str(exc)) from None
    except (BKError, MetadataFormatError) as exc:
        raise click.ClickException(str(exc)) from None


def ledger_document(ledger_id: int, metadata: LedgerMetadata) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(metadata.to_json())
    document["ledger_id"] = ledger_id
    document["version"] = metadata.version
    return document


@click.group(name="bookies", help="The bookies registered in the metadata store.")
def bookies_group() -> None:
    pass


@bookies_group.command("list", help="List live bookies (writable and read-only).")
@metadata_option
@json_option
def bookies_list(metadata: str | None, as_json: bool) -> None:
    bookies = run_with_store(metadata, lambda store: store.list_bookies())
    if as_json:
        rows = [
            {
                "id": b.bookie_id,
                "address": b.address,
                "state": b.state,
                "software_version": b.software_version,
                "free_bytes": b.free_bytes,
                "total_bytes": b.total_bytes,
            }
            for b in bookies
        ]
        click.echo(json.dumps(rows))
        return
    table = Table()
    for column in ("id", "address", "state", "free GiB", "version"):
        table.add_column(column)
    for b in bookies:
        table.add_row(
            b.bookie_id, b.address, b.state, f"{b.free_bytes / 2**30:.1f}", b.software_version
        )
    Console().print(table)


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


def print_ledger_table(ledger_id: int, found: LedgerMetadata) -> None:
    """One ledger's metadata as a two-column table (``ledger show``, ``ledger recover``)."""
    table = Table(show_header=False)
    table.add_column("field")
    table.add_column("value")
    last = "-" if found.last_entry_id is None else str(found.last_entry_id)
    rows = [
        ("ledger", str(ledger_id)),
        ("state", found.state.value),
        (
            "ensemble / write / ack",
            f"{found.ensemble_size} / {found.write_quorum} / {found.ack_quorum}",
        ),
        ("last entry", last),
        ("length", str(found.length)),
        ("durability", found.durability.name),
        ("digest", found.digest_type.name),
        ("version", str(found.version)),
    ]
    rows += [(f"fragment from {f.first_entry_id}", ", ".join(f.ensemble)) for f in found.fragments]
    rows += [(f"custom {k}", repr(v)) for k, v in found.custom_metadata.items()]
    for row in rows:
        table.add_row(*row)
    Console().print(table)
