"""The ``aiobk`` console script.

Every command exits non-zero with one line on stderr for bad input (``aiobk: error: ...``);
click's multi-line usage dump is kept for ``--help``.
"""

from __future__ import annotations

import importlib
from typing import ClassVar

import click

from aiobk.commands import (
    QuietPipeGroup,
    bookie_group,
    bookies_group,
    cookie_group,
    ledger_group,
    log_group,
    run_group,
    simpletest_command,
    standalone_command,
    with_log_level,
    with_tls_options,
)
from aiobk.commands.autorecovery import autorecovery_group


@click.group(cls=QuietPipeGroup, help="aiobk: BookKeeper's replicated log, asyncio-native.")
@click.version_option(package_name="aiobk")
def cli() -> None:
    pass


cli.add_command(bookie_group)
cli.add_command(standalone_command)
cli.add_command(cookie_group)
cli.add_command(bookies_group)
cli.add_command(ledger_group)
cli.add_command(log_group)
cli.add_command(simpletest_command)
cli.add_command(autorecovery_group)
# Every long-running command takes --log-level; bookie start has its own, which
# falls back on the log_level of its --config, as autorecovery start does.
for _command in (
    standalone_command,
    simpletest_command,
    log_group.commands["tail"],
    bookies_group.commands["decommission"],
):
    with_log_level(_command)


def _dialing_bookies(group: click.Group) -> list[click.Command]:
    """Every command that may connect to bookies: those with --metadata (clients, the
    standalone autorecovery, decommission) and the ones given a bookie's address."""
    found = []
    for command in group.commands.values():
        if isinstance(command, click.Group):
            found += _dialing_bookies(command)
        elif any(p.name == "metadata" for p in command.params):
            found.append(command)
    return found


# Client commands take --tls-ca/--tls-cert/--tls-key; bookie start has its own
# tls_* settings, and standalone's bookies are local and plaintext.
for _command in {
    *_dialing_bookies(cli),
    bookie_group.commands["gc"],
    bookie_group.commands["state"],
} - {bookie_group.commands["start"], standalone_command}:
    with_tls_options(_command)


class _BenchGroup(click.Group):
    """The benchmarks, each imported only when asked for (they load the client, rich, hdrh).

    Each is the click command of its module, so ``aiobk bench NAME`` and
    ``python -m aiobk.bench.NAME`` take the same options and print the same help.
    """

    commands_by_module: ClassVar[dict[str, str]] = {
        "add": "aiobk.bench.add",
        "autorecovery": "aiobk.bench.autorecovery",
        "index": "aiobk.bench.index_engines",
        "journal": "aiobk.bench.journal",
        "metadata": "aiobk.bench.metadata",
        "peers": "aiobk.bench.peers",
        "scale": "aiobk.bench.scale",
        "spark": "aiobk.bench.spark",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.commands_by_module})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self.commands_by_module.get(cmd_name)
        if module is None:
            return super().get_command(ctx, cmd_name)
        command = importlib.import_module(module).command
        assert isinstance(command, click.Command)
        return with_log_level(command)


@cli.group(name="bench", cls=_BenchGroup, help="Benchmarks (see bench/README.md).")
def bench_group() -> None:
    pass


def main(argv: list[str] | None = None) -> None:
    run_group(cli, "aiobk", argv)
