"""The ``aiobk`` console script.

Every command exits non-zero with one line on stderr for bad input (``aiobk: error: ...``);
click's multi-line usage dump is kept for ``--help``.
"""

from __future__ import annotations

import click

from aiobk.standalone import standalone_command
from bookie.cli import bookie_group, run_group
from metadata.cli import bookies_group, ledger_group


@click.group(help="aiobk: BookKeeper's replicated log, asyncio-native.")
@click.version_option(package_name="aiobk")
def cli() -> None:
    pass


cli.add_command(bookie_group)
cli.add_command(standalone_command)
cli.add_command(bookies_group)
cli.add_command(ledger_group)


def main(argv: list[str] | None = None) -> None:
    run_group(cli, "aiobk", argv)
