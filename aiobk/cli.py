"""The ``aiobk`` console script.

Every command exits non-zero with one line on stderr for bad input (``aiobk: error: ...``);
click's multi-line usage dump is kept for ``--help``. A warning (a deprecated setting in a
configuration file, say) is one line too (``aiobk: warning: ...``).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import warnings
from typing import IO, ClassVar

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
from aiobk.commands.extras import extra_message
from aiobk.commands.offload import offload_group


@click.group(cls=QuietPipeGroup, help="aiobk: BookKeeper's replicated log, asyncio-native.")
@click.version_option(package_name="aiobk", message="%(prog)s %(version)s")
def cli() -> None:
    pass


cli.add_command(bookie_group)
cli.add_command(standalone_command)
cli.add_command(cookie_group)
cli.add_command(bookies_group)
cli.add_command(ledger_group)
cli.add_command(log_group)
cli.add_command(offload_group)
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


def _refusal(name: str, extra: str, message: str) -> click.Command:
    """Stands in for a command whose ``extra`` is not installed: listed by ``--help`` as
    needing it, and refusing with ``message`` whatever the arguments (``--help`` too)."""

    def refuse(args: tuple[str, ...]) -> None:
        raise click.ClickException(message)

    return click.Command(
        name,
        callback=refuse,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help=message,
        short_help=f"(needs the {extra} extra)",
        add_help_option=False,
    )


class _BenchGroup(click.Group):
    """The benchmarks, each imported only when asked for (they load the client, rich, hdrh),
    and only when the extras it needs are installed (else it refuses with one line).

    Each is the click command of its module, so ``aiobk bench NAME`` and
    ``python -m aiobk.bench.NAME`` take the same options and print the same help.
    """

    commands_by_module: ClassVar[dict[str, str]] = {
        "add": "aiobk.bench.add",
        "autorecovery": "aiobk.bench.autorecovery",
        "index": "aiobk.bench.index_engines",
        "journal": "aiobk.bench.journal",
        "metadata": "aiobk.bench.metadata",
        "offload": "aiobk.bench.offload",
        "peers": "aiobk.bench.peers",
        "scale": "aiobk.bench.scale",
        "spark": "aiobk.bench.spark",
    }
    extras_by_command: ClassVar[dict[str, tuple[str, ...]]] = {
        "offload": ("bench", "spark"),
        "spark": ("bench", "spark"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.commands_by_module})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self.commands_by_module.get(cmd_name)
        if module is None:
            return super().get_command(ctx, cmd_name)
        for extra in self.extras_by_command.get(cmd_name, ("bench",)):
            message = extra_message(f"aiobk bench {cmd_name}", extra)
            if message is not None:
                return _refusal(cmd_name, extra, message)
        command = importlib.import_module(module).command
        assert isinstance(command, click.Command)
        return with_log_level(command)


@cli.group(name="bench", cls=_BenchGroup, help="Benchmarks (see bench/README.md).")
def bench_group() -> None:
    pass


def _warn_in_one_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: IO[str] | None = None,
    line: str | None = None,
) -> None:
    """Python shows a warning as the file and line that raised it plus that source line: for
    an operator the message is what counts, on one line like the errors."""
    click.echo(f"aiobk: warning: {message}", err=True)


def main(argv: list[str] | None = None) -> None:
    warnings.showwarning = _warn_in_one_line
    try:
        run_group(cli, "aiobk", argv)
    except SystemExit as done:
        if argv is None and "obstore" in sys.modules:  # the process's own command line
            _leave_now(done.code)
        raise


def _leave_now(code: object) -> None:
    """End a command that used an object store without the interpreter's finalization: the
    store client's runtime threads outlive the command, and one touching the interpreter
    while it is torn down aborts the process after the command's work is done (about one
    exit in five on a loaded machine), which would turn a success into exit status 134.
    Output is flushed and logging shut down first; nothing else is left to run."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    status = code if isinstance(code, int) else 0
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
