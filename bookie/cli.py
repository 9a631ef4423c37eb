"""``aiobk bookie start|format`` (also ``python -m aiobk.bookie``), and the runner every ``aiobk``
command goes through: bad input exits non-zero with one line on stderr (``PROG: error: ...``),
never click's multi-line usage dump."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable
from typing import Any

import click
import uvloop

from aiobk.bookie.config import BookieConfig, ConfigError
from aiobk.bookie.cookies import COOKIE_FILE, directories, fix_cookies, marker_present
from aiobk.bookie.disk import OsDisk
from aiobk.bookie.index import IndexCorruptError
from aiobk.bookie.journal_format import JournalCorruptError
from aiobk.bookie.metrics import serve_metrics
from aiobk.bookie.server import Bookie
from aiobk.metadata import MetadataURIError, open_store
from aiobk.protocol import (
    BookieStateRequest,
    BookieStateResponse,
    GcRequest,
    GcResponse,
    Request,
    Response,
    StateChange,
    StatusCode,
)
from aiobk.protocol.errors import BKError

log = logging.getLogger("aiobk.bookie")


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_logging(level: str) -> None:
    """One format for every command; each layer logs under its own name (``aiobk.bookie.*``,
    ``aiobk.client.*``, ``aiobk.metadata.*``), so ``logging.getLogger("aiobk.client")`` tunes
    one of them."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)


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


def install_event_loop_policy() -> None:
    """uvloop (a declared dependency) for every command that runs a loop."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run_until_signalled(bookie: Bookie) -> None:
    """Start ``bookie``, print its address, serve until SIGTERM/SIGINT, then stop cleanly."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await bookie.start()
        if bookie.config.metrics_port is not None:
            serve_metrics(
                bookie.stats,
                bookie.bookie_id,
                bookie.config.host,
                bookie.config.metrics_port,
                bookie.gauges,
            )
        click.echo(f"bookie {bookie.bookie_id} serving on {bookie.address}", nl=True)
        sys.stdout.flush()
        await stop.wait()
        click.echo("stopping", err=True)
        await bookie.stop()

    install_event_loop_policy()
    asyncio.run(main())


@click.group(name="bookie", cls=QuietPipeGroup, help="Run and manage a bookie (storage server).")
def bookie_group() -> None:
    pass


@bookie_group.command("start", help="Start a bookie and serve until SIGTERM or SIGINT.")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (default 3181).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Ledger data.")
@click.option("--journal-dir", type=click.Path(file_okay=False), default=None, help="Journal.")
@click.option(
    "--host", default=None, help="Address to listen on (default 127.0.0.1; 0.0.0.0: all)."
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None)
@click.option("--no-journal-write-data", is_flag=True, help="BP-46: adds skip the journal.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None)
@click.option("--bookie-id", default=None, help="Identity in metadata (default host:port).")
@click.option("--metadata", envvar="AIOBK_METADATA", default=None, help="Metadata service URI.")
@click.option(
    "--advertised-address",
    default=None,
    help="host:port clients dial (default --host:--port; with --host 0.0.0.0, this host's "
    "address toward other hosts).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="Log at this level and above to stderr (default: log_level in --config, else info).",
)
def start_command(
    port: int | None,
    data_dir: str | None,
    journal_dir: str | None,
    host: str | None,
    config_file: str | None,
    no_journal_write_data: bool,
    metrics_port: int | None,
    bookie_id: str | None,
    metadata: str | None,
    advertised_address: str | None,
    log_level: str | None,
) -> None:
    overrides: dict[str, Any] = {
        "advertised_address": advertised_address,
        "port": port,
        "data_dir": data_dir,
        "journal_dir": journal_dir,
        "host": host,
        "metrics_port": metrics_port,
        "bookie_id": bookie_id,
        "metadata_uri": metadata,
        "journal_write_data": False if no_journal_write_data else None,
    }
    try:
        if config_file is not None:
            config = BookieConfig.from_toml(config_file, **overrides)
        else:
            if data_dir is None:
                raise click.UsageError("--data-dir is required (or data_dir in --config)")
            config = BookieConfig.from_mapping({}, **overrides)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    configure_logging(log_level or config.log_level)
    try:
        run_until_signalled(Bookie(config))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except (MetadataURIError, BKError) as exc:
        raise click.ClickException(f"cannot start bookie: {exc}") from None
    except (JournalCorruptError, IndexCorruptError) as exc:
        raise click.ClickException(f"refusing to start, data is damaged: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot start bookie: {exc}") from None


@bookie_group.command("format", help="Prepare (or with --force wipe) a bookie's directories.")
@click.option("--data-dir", type=click.Path(file_okay=False), required=True)
@click.option("--journal-dir", type=click.Path(file_okay=False), default=None)
@click.option("--force", is_flag=True, help="Delete existing bookie data first.")
def format_command(data_dir: str, journal_dir: str | None, force: bool) -> None:
    config = BookieConfig(data_dir=data_dir, journal_dir=journal_dir)
    paths = [config.ledgers_path, config.journal_path]
    holding = [p for p in paths if os.path.isdir(p) and os.listdir(p)]
    if holding and not force:
        raise click.ClickException(
            f"{holding[0]} already holds bookie data; pass --force to delete it"
        )
    for path in holding:
        shutil.rmtree(path)
    for path in paths:
        os.makedirs(path, exist_ok=True)
    click.echo(f"formatted {data_dir}" + (f" (journal {journal_dir})" if journal_dir else ""))


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


@click.group(name="cookie", help="Inspect or fix a bookie's cookies (BP-46).")
def cookie_group() -> None:
    pass


def _cookie_config(data_dir: str, journal_dir: str | None) -> BookieConfig:
    return BookieConfig(data_dir=data_dir, journal_dir=journal_dir)


@cookie_group.command("show", help="Print the cookies in the directories and in the store.")
@click.option("--data-dir", type=click.Path(file_okay=False), required=True)
@click.option("--journal-dir", type=click.Path(file_okay=False), default=None)
@click.option("--bookie-id", default=None, help="Also show the store's cookie for this id.")
@click.option("--metadata", envvar="AIOBK_METADATA", default=None)
def cookie_show(
    data_dir: str, journal_dir: str | None, bookie_id: str | None, metadata: str | None
) -> None:
    config = _cookie_config(data_dir, journal_dir)
    if not os.path.isdir(data_dir):
        raise click.ClickException(f"no bookie data directory at {data_dir}")

    async def collect() -> dict[str, object]:
        disk = OsDisk()
        out: dict[str, object] = {}
        try:
            journal_dirs, data_dirs = directories(config)
            for directory in dict.fromkeys([*journal_dirs, *data_dirs]):
                path = os.path.join(directory, COOKIE_FILE)
                found = await disk.read_file(path) if await disk.exists(path) else None
                out[directory] = json.loads(found) if found is not None else None
            if bookie_id and metadata:
                store = open_store(metadata)
                try:
                    remote = await store.read_cookie(bookie_id)
                finally:
                    await store.close()
                out["metadata"] = json.loads(remote.to_json()) if remote is not None else None
            out["unclean_shutdown_marker"] = await marker_present(disk, config)
        finally:
            await disk.close()
        return out

    try:
        found = uvloop.run(collect())
    except (MetadataURIError, BKError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot read the cookies: {exc}") from None
    cookies = [v for k, v in found.items() if k != "unclean_shutdown_marker" and v is not None]
    if not cookies:
        where = ", ".join(k for k in found if k != "unclean_shutdown_marker")
        raise click.ClickException(
            f"no cookie in {where}: no bookie has started on these directories"
        )
    click.echo(json.dumps(found, indent=2))


@cookie_group.command("fix", help="Rewrite the cookies after a disk was lost or replaced.")
@click.option("--data-dir", type=click.Path(file_okay=False), required=True)
@click.option("--journal-dir", type=click.Path(file_okay=False), default=None)
@click.option("--bookie-id", required=True, help="The bookie's id (its host:port by default).")
@click.option("--metadata", envvar="AIOBK_METADATA", default=None)
def cookie_fix(
    data_dir: str, journal_dir: str | None, bookie_id: str, metadata: str | None
) -> None:
    """Writes new cookies everywhere and sets the unclean-shutdown marker, so that the next start
    fences this bookie's ledgers and puts the open ones in limbo (BP-46): a fixed cookie alone
    would let a bookie that lost data answer as if it had not."""
    if not metadata:
        raise click.UsageError("--metadata (or AIOBK_METADATA) is required")
    config = _cookie_config(data_dir, journal_dir)

    async def fix() -> str:
        disk = OsDisk()
        store = open_store(metadata)
        try:
            cookie = await fix_cookies(
                disk, config, store, bookie_id, bookie_id, os.urandom(16).hex()
            )
            return cookie.instance_id
        finally:
            await store.close()
            await disk.close()

    try:
        instance = uvloop.run(fix())
    except (MetadataURIError, BKError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"cookies of {bookie_id} rewritten (instance {instance}); the next start fences")


bookie_group.add_command(cookie_group)


def _ask_bookie(address: str, make: Callable[[int], Request], timeout: float) -> Response:
    """Send one request to the bookie at HOST:PORT and return its answer (any status)."""
    from aiobk.client import BookieConnection  # noqa: PLC0415 - the client layer, for admin commands

    host, _sep, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {address!r}", param_hint="ADDRESS")

    async def run() -> Response:
        conn = await BookieConnection.open(host, int(port), timeout=min(timeout, 10.0))
        try:
            return await conn.send(make(conn.next_txn_id()), timeout)
        finally:
            conn.close()

    try:
        return uvloop.run(run())
    except BKError as exc:
        raise click.ClickException(str(exc)) from None


@bookie_group.command("gc", help="Run a garbage collection pass on a running bookie now.")
@click.argument("address")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=600.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def gc_command(address: str, timeout: float, as_json: bool) -> None:
    """Deleted ledgers are dropped and their entry logs removed or compacted (see the README,
    "Deleting ledgers and reclaiming disk"); the bookie runs one pass every ``gc_interval``."""
    response = _ask_bookie(address, GcRequest, timeout)
    if not isinstance(response, GcResponse) or response.status is not StatusCode.EOK:
        detail = response.detail if isinstance(response, GcResponse) else ""
        raise click.ClickException(f"{address}: {response.status.name}: {detail}")
    figures = {
        "ledgers_deleted": response.ledgers_deleted,
        "logs_removed": response.logs_removed,
        "entries_moved": response.entries_moved,
        "bytes_freed": response.bytes_freed,
        "skipped": response.detail,
    }
    if as_json:
        click.echo(json.dumps(figures))
    else:
        click.echo(
            f"{address}: {response.ledgers_deleted} deleted ledger(s) dropped, "
            f"{response.logs_removed} entry log(s) removed, {response.entries_moved} entries "
            f"moved, {response.bytes_freed} bytes freed"
        )
    if response.detail:
        raise click.ClickException(f"{address}: the pass stopped early: {response.detail}")


@bookie_group.command("state", help="Show a running bookie's state, or force it read-only.")
@click.argument("address")
@click.option("--readonly", "change", flag_value="readonly", help="Refuse adds from now on.")
@click.option("--writable", "change", flag_value="writable", help="Lift --readonly.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
def state_command(address: str, change: str | None, timeout: float, as_json: bool) -> None:
    """A read-only bookie refuses adds (writers move to other bookies) and serves everything
    else; it is registered read-only, so ``aiobk bookies list`` shows it. ``--writable`` lifts
    only an operator's ``--readonly``: a full disk or a failed journal keeps it read-only
    until it clears (the reasons are printed)."""
    wanted = {
        None: StateChange.QUERY,
        "readonly": StateChange.READ_ONLY,
        "writable": StateChange.WRITABLE,
    }[change]
    response = _ask_bookie(address, lambda txn: BookieStateRequest(txn, wanted), timeout)
    if not isinstance(response, BookieStateResponse) or response.status is not StatusCode.EOK:
        raise click.ClickException(f"{address}: {response.status.name}")
    reasons = [r for r in response.reasons.split("; ") if r]
    document = {
        "address": address,
        "state": "writable" if response.writable else "readonly",
        "reasons": reasons,
        "high_priority_writes": bool(response.high_priority),
        "checkpoint_error": response.checkpoint_error or None,
    }
    if as_json:
        click.echo(json.dumps(document))
    else:
        click.echo(f"{address}: {document['state']}")
        for reason in reasons:
            click.echo(f"  {reason}")
        if response.checkpoint_error:
            click.echo(f"  checkpoints failing: {response.checkpoint_error}")
    if change == "writable" and not response.writable:
        raise click.ClickException(f"{address} stays read-only: {'; '.join(reasons)}")
