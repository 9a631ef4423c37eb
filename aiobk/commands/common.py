"""What every ``aiobk`` command shares: the runner (bad input exits non-zero with one line on
stderr, ``PROG: error: ...``, never click's multi-line usage dump), ``--log-level``, the
``--metadata``/``--json``/``--password``/``--yes`` options, and running an action against the
metadata store or a client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import click

from aiobk.client.bookkeeper import BookKeeper
from aiobk.client.config import ClientConfig
from aiobk.client.net import Connector, TlsConnector
from aiobk.client.tls_files import TlsFilesError, client_context
from aiobk.commands.records import format_time
from aiobk.commands.text import echo_table, format_size
from aiobk.logging_setup import LOG_LEVELS, configure_logging
from aiobk.metadata import (
    LedgerMetadata,
    MetadataFormatError,
    MetadataStore,
    MetadataURIError,
    OffloadRecord,
    open_store,
)
from aiobk.protocol.errors import BKError, UnauthorizedError
from aiobk.tiered.open import redact


def with_log_level(command: click.Command, default: str = "warning") -> click.Command:
    """Give a long-running command ``--log-level``, applied before it runs."""
    if any(param.name == "log_level" for param in command.params):
        return command

    def apply(_ctx: click.Context, _param: click.Parameter, value: str) -> None:
        configure_logging(value)

    command.params.append(
        click.Option(
            ["--log-level"],
            type=click.Choice(LOG_LEVELS, case_sensitive=False),
            default=default,
            show_default=True,
            expose_value=False,
            callback=apply,
            help="Log messages at this level and above to stderr.",
        )
    )
    return command


class QuietPipeGroup(click.Group):
    """A reader that stops reading (``aiobk ledger list | head -1``) is not an error: exit 0,
    with no "Exception ignored ... BrokenPipeError" at interpreter exit."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout once more at exit
            os.close(devnull)
            return 0


def run_group(group: click.Command, prog_name: str, argv: list[str] | None = None) -> None:
    try:
        result = group.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo(f"{prog_name}: aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        message = " ".join(exc.format_message().split())
        click.echo(f"{prog_name}: error: {message}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(result if isinstance(result, int) else 0)


T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when it is installed (the bookie extra brings it), else on
    asyncio's own loop: a client command works the same on either."""
    try:
        import uvloop  # noqa: PLC0415 - optional: not a dependency of the client install
    except ModuleNotFoundError:
        return asyncio.run(main)
    return uvloop.run(main)


metadata_option = click.option(
    "--metadata",
    envvar="AIOBK_METADATA",
    default=None,
    help="Metadata service URI (etcd://HOST:PORT/PREFIX); or set AIOBK_METADATA.",
)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


_AMOUNT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3_600, "d": 86_400}
_BYTES = {
    "": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
}  # fmt: skip


def parse_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """Seconds on the command line: a number with an optional unit, ``s``, ``m``, ``h`` or
    ``d`` (``90s``, ``30m``, ``4h``, ``1.5d``; a bare number is seconds)."""
    if value is None:
        return None
    match = _AMOUNT.fullmatch(value.lower())
    if match is None or match.group(2) not in _SECONDS:
        message = f"not a duration (a number of s, m, h or d, e.g. 4h): {value!r}"
        raise click.BadParameter(message, ctx, param)
    return float(match.group(1)) * _SECONDS[match.group(2)]


def parse_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Bytes on the command line: a number with an optional binary unit, ``B``, ``KiB``,
    ``MiB``, ``GiB`` or ``TiB`` (``K``, ``M``, ``G``, ``T`` for short; any case)."""
    if value is None:
        return None
    match = _AMOUNT.fullmatch(value.lower())
    if match is None or match.group(2) not in _BYTES:
        message = f"not a size (a number of B, KiB, MiB, GiB or TiB): {value!r}"
        raise click.BadParameter(message, ctx, param)
    return int(float(match.group(1)) * _BYTES[match.group(2)])


# ---------------------------------------------------------------------- TLS to bookies

TLS_META = "aiobk.tls"  # click context meta: option name -> file given
TLS_OPTIONS = (
    ("--tls-ca", "AIOBK_TLS_CA", "CA certificates bookies' certificates must chain to (PEM)."),
    ("--tls-cert", "AIOBK_TLS_CERT", "This client's certificate (PEM): its identity and roles."),
    ("--tls-key", "AIOBK_TLS_KEY", "The private key of --tls-cert (PEM)."),
)


def with_tls_options(command: click.Command) -> click.Command:
    """Give a command that dials bookies ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (or
    ``AIOBK_TLS_*``): any of them makes every bookie connection TLS (``client_tls``)."""
    if any(param.name == "tls_ca" for param in command.params):
        return command

    def remember(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value:
            ctx.meta.setdefault(TLS_META, {})[param.name] = value

    for flag, env, text in TLS_OPTIONS:
        command.params.append(
            click.Option(
                [flag],
                envvar=env,
                default=None,
                expose_value=False,
                callback=remember,
                type=click.Path(dir_okay=False),
                help=text,
            )
        )
    return command


def client_tls() -> ssl.SSLContext | None:
    """The TLS context for bookie connections the command's ``--tls-*`` options (or, for a
    command without them, ``AIOBK_TLS_*``) ask for; None for plaintext. Bad files are a usage
    error naming the file."""
    ctx = click.get_current_context(silent=True)
    given: dict[str, str] = dict(ctx.meta.get(TLS_META, {})) if ctx is not None else {}
    if ctx is None or not any(p.name == "tls_ca" for p in ctx.command.params):
        for flag, env, _text in TLS_OPTIONS:
            if os.environ.get(env):
                given[flag[2:].replace("-", "_")] = os.environ[env]
    if given.get("tls_key") and not given.get("tls_cert"):
        raise click.UsageError("--tls-key needs --tls-cert")
    try:
        return client_context(given.get("tls_ca"), given.get("tls_cert"), given.get("tls_key"))
    except TlsFilesError as exc:
        raise click.UsageError(str(exc)) from None


def client_connector() -> Connector | None:
    """What ``BookieConnection.open`` needs for ``client_tls`` (None: plaintext)."""
    tls = client_tls()
    return TlsConnector(tls) if tls is not None else None


def require_metadata(uri: str | None) -> str:
    """The metadata URI a command was given; a usage error before anything else when none was
    (before a confirmation is asked for, too)."""
    if not uri:
        raise click.UsageError("--metadata (or AIOBK_METADATA) is required")
    return uri


def run_with_store(uri: str | None, action: Callable[[MetadataStore], Awaitable[T]]) -> T:
    """Open the store, check that it holds a cluster (a prefix where none was ever set up is
    an error, not an empty cluster), run ``action`` (``run_loop``), close; store errors become
    one-line errors."""
    uri = require_metadata(uri)

    async def main() -> T:
        store = open_store(uri)
        try:
            await store.check_cluster()
            return await action(store)
        finally:
            await store.close()

    try:
        return run_loop(main())
    except MetadataURIError as exc:
        raise click.UsageError(str(exc)) from None
    except (BKError, MetadataFormatError) as exc:
        raise click.ClickException(str(exc)) from None


def ledger_document(ledger_id: int, metadata: LedgerMetadata) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(metadata.to_json())
    document["ledger_id"] = ledger_id
    document["version"] = metadata.version
    return document


def print_ledger_table(ledger_id: int, found: LedgerMetadata) -> None:
    """One ledger's metadata as a two-column table (``ledger show``, ``ledger recover``)."""
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
    rows += offload_rows(found.offload)
    echo_table(rows)


def offload_rows(record: OffloadRecord | None) -> list[tuple[str, str]]:
    """The rows naming a ledger's copy in an object store, when it has one (or an attempt)."""
    if record is None:
        return []
    when = {"started": record.started, "copied": record.copied, "released": record.released}
    return [
        ("offloaded", f"{record.state.value} to {redact(record.store)}"),
        ("offload key", record.key),
        (
            "offload size",
            f"{record.size} bytes ({format_size(record.size)}), {record.entries} entries",
        ),
        *((f"offload {name}", format_time(ms)) for name, ms in when.items() if ms is not None),
    ]


def run_with_client(uri: str | None, action: Callable[[BookKeeper], Awaitable[T]]) -> T:
    """Connect (TLS to bookies as ``client_tls`` says), run ``action`` (``run_loop``), close;
    client errors become one-line errors."""
    uri = require_metadata(uri)
    tls = client_tls()

    async def main() -> T:
        async with BookKeeper(uri, ClientConfig(), tls=tls) as bk:
            return await action(bk)

    try:
        return run_loop(main())
    except MetadataURIError as exc:
        raise click.UsageError(str(exc)) from None
    except UnauthorizedError as exc:
        raise click.ClickException(_password_hint(str(exc))) from None
    except BKError as exc:
        raise click.ClickException(str(exc)) from None


def _password_hint(message: str) -> str:
    """A wrong password's message, saying what to do about it on a command that takes
    ``--password``."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or "--password" in message:
        return message
    if not any(param.name == "password" for param in ctx.command.params):
        return message
    if ctx.params.get("password"):
        return f"{message}: the --password given is not the ledger's"
    return f"{message}: give the ledger's password with --password"


async def until_signalled(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` until it ends or the process gets SIGINT (Ctrl-C) or SIGTERM, which end it
    as a normal stop: how a command that runs until told (``log tail --follow``) finishes. The
    loop's own handlers, so a SIGINT ignored since the process started (a background job, or a
    child of one) stops it too -- Python leaves an inherited "ignore" in place, and asyncio's
    Ctrl-C handling then never sees the signal."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(work)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        task.cancel()

    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop)
    try:
        await task
    except asyncio.CancelledError:
        if not stopped:
            raise  # cancelled from outside, not by a signal
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


@contextlib.contextmanager
def quiet_on_closed_pipe() -> Iterator[None]:
    """A reader that went away (``aiobk ledger read 7 | head -1``) ends the command quietly,
    status 0: what a consumer did not read was not wanted."""
    try:
        yield
    except BrokenPipeError:
        # Python flushes stdout once more at exit; that write would fail too and print
        # "Exception ignored ... BrokenPipeError". Point the descriptor at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def refuse_unless_confirmable(what: str, yes: bool) -> None:
    """Before any I/O: a destructive command without ``--yes`` needs a terminal to ask on
    (never a silent default, never a hang on a pipe)."""
    if not yes and not sys.stdin.isatty():
        raise click.UsageError(f"{what} needs confirmation and stdin is not a terminal; pass --yes")


def confirm_or_stop(question: str, refused: str) -> None:
    """Ask on the terminal (the question on stderr: stdout is for data); "no" stops."""
    if not click.confirm(question, default=False, err=True):
        raise click.ClickException(refused)


password_option = click.option(
    "--password", default="", help="The ledger's password (UTF-8).", show_default=False
)


yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")


def delete_password_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--password`` and ``--no-password-check`` of a command that deletes ledgers (a ledger
    with a password is deleted only with it); the command gets ``password`` as
    ``bytes | None`` and ``force``."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    command = click.option(
        "--no-password-check", "force", is_flag=True,
        help="Delete without the password: for an operator whose credentials to the metadata "
        "store allow it (etcd's roles on the prefix are the barrier there; the check only "
        "keeps a client with a wrong password from deleting).",
    )(command)  # fmt: skip
    return click.option(
        "--password", default=None, callback=check,
        help="The ledgers' password (UTF-8); required for ledgers that have one.",
    )(command)  # fmt: skip
