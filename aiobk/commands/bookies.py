"""``aiobk bookies list``: the bookies registered in the metadata store."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from aiobk.commands.common import json_option, metadata_option, run_with_store


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
