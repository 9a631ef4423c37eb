"""The ``aiobk`` console script.

Every command exits non-zero with one line on stderr for bad input (``aiobk: error: ...``);
click's multi-line usage dump is kept for ``--help``.
"""

from __future__ import annotations

import click

from aiobk.standalone import standalone_command
from bookie.cli import bookie_group, cookie_group, run_group
from client.cli import add_ledger_commands, simpletest_command
from client.log_cli import log_group
from metadata.cli import bookies_group, ledger_group


@click.group(help="aiobk: BookKeeper's replicated log, asyncio-native.")
@click.version_option(package_name="aiobk")
def cli() -> None:
    pass


cli.add_command(bookie_group)
cli.add_command(standalone_command)
cli.add_command(cookie_group)
cli.add_command(bookies_group)
cli.add_command(ledger_group)
add_ledger_commands(ledger_group)
cli.add_command(log_group)
cli.add_command(simpletest_command)


@cli.group(name="bench", help="Benchmarks (see bench/README.md).")
def bench_group() -> None:
    pass


@bench_group.command(
    "add", context_settings={"ignore_unknown_options": True, "allow_extra_args": True}
)
@click.pass_context
def bench_add(ctx: click.Context) -> int:
    """Client append throughput and latency on a local cluster (bench/add.py)."""
    from bench.add import main as bench_main  # noqa: PLC0415 - benchmarks load on demand

    return bench_main(list(ctx.args))


def main(argv: list[str] | None = None) -> None:
    run_group(cli, "aiobk", argv)
