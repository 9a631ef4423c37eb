"""``aiobk bookie start|format|gc|state`` (also ``python -m aiobk.bookie``).

``start`` builds the bookie through ``aiobk.runner``, which hands it the client's repairer for
BP-46's boot repair: the bookie layer itself never imports the client. ``start`` needs the
bookie extra; the others work from the client install."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

import click

from aiobk.bookie.config import BookieConfig, ConfigError
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.bookie.journal.format import JournalCorruptError
from aiobk.client import BookieConnection
from aiobk.client.connection import status_error
from aiobk.commands.common import QuietPipeGroup, client_connector, metadata_option, run_loop
from aiobk.commands.cookie import cookie_alias
from aiobk.commands.extras import require_extras
from aiobk.commands.text import echo_table, format_size
from aiobk.logging_setup import LOG_LEVELS, configure_logging
from aiobk.metadata import MetadataURIError
from aiobk.protocol import (
    BookieStateRequest,
    BookieStateResponse,
    ErrorResponse,
    GcReportRequest,
    GcReportResponse,
    GcRequest,
    GcResponse,
    Request,
    Response,
    StateChange,
    StatusCode,
)
from aiobk.protocol.errors import BKError

log = logging.getLogger(__name__)


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
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A TOML file of bookie settings (flags win over it).",
)
@click.option("--no-journal-write-data", is_flag=True, help="BP-46: adds skip the journal.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None)
@click.option(
    "--http-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the HTTP admin API on this port (default: off).",
)
@click.option("--http-host", default=None, help="Address of the HTTP admin API (default --host).")
@click.option("--bookie-id", default=None, help="Identity in metadata (default host:port).")
@metadata_option
@click.option(
    "--advertised-address",
    default=None,
    help="host:port clients dial (default --host:--port; with --host 0.0.0.0, this host's "
    "address toward other hosts).",
)
@click.option(
    "--rack",
    default=None,
    help="Its failure domain, /ZONE/RACK: clients spread each entry's copies over racks and "
    "zones (default /default-zone/default-rack).",
)
@click.option("--tls-cert-file", default=None, help="The bookie's TLS certificate (PEM).")
@click.option("--tls-key-file", default=None, help="Its private key (PEM).")
@click.option("--tls-ca-file", default=None, help="CA certificates peers' certificates chain to.")
@click.option(
    "--tls-client-auth/--no-tls-client-auth",
    default=None,
    help="Require a client certificate; its OU attributes are the peer's roles.",
)
@click.option(
    "--tls-only/--no-tls-only", default=None, help="Refuse connections that do not upgrade to TLS."
)
@click.option(
    "--tls-reload-interval",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds between checks of the TLS files for changes (0: never; default 60).",
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
    http_port: int | None,
    http_host: str | None,
    bookie_id: str | None,
    metadata: str | None,
    advertised_address: str | None,
    rack: str | None,
    tls_cert_file: str | None,
    tls_key_file: str | None,
    tls_ca_file: str | None,
    tls_client_auth: bool | None,
    tls_only: bool | None,
    tls_reload_interval: float | None,
    log_level: str | None,
) -> None:
    require_extras("aiobk bookie start", "bookie")
    # The server's wiring (RocksDB, the exporter, the HTTP admin API): the bookie extra's.
    from aiobk.runner import make_bookie, run_until_signalled  # noqa: PLC0415

    overrides: dict[str, Any] = {
        "tls_cert_file": tls_cert_file,
        "tls_key_file": tls_key_file,
        "tls_ca_file": tls_ca_file,
        "tls_client_auth": tls_client_auth,
        "tls_only": tls_only,
        "tls_reload_interval": tls_reload_interval,
        "advertised_address": advertised_address,
        "rack": rack,
        "port": port,
        "data_dir": data_dir,
        "journal_dir": journal_dir,
        "host": host,
        "metrics_port": metrics_port,
        "http_port": http_port,
        "http_host": http_host,
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
    if not config.metadata_uri:
        log.warning(
            "no metadata service URI (--metadata, AIOBK_METADATA or metadata_uri in --config): "
            "this bookie serves unregistered: no cluster lists it, so no client picks it for a "
            "ledger, and it keeps no cookie in a metadata store"
        )
    try:
        run_until_signalled(make_bookie(config))
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


bookie_group.add_command(cookie_alias())


def _ask_bookie(
    address: str, make: Callable[[int], Request], timeout: float, *, unknown_ok: bool = False
) -> Response:
    """Send one request to the bookie at HOST:PORT and return its answer (any status; with
    ``unknown_ok`` an older bookie's ErrorResponse to a request it does not know)."""

    host, _sep, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {address!r}", param_hint="ADDRESS")

    connector = client_connector()

    async def run() -> Response:
        conn = await BookieConnection.open(
            host, int(port), timeout=min(timeout, 10.0), connector=connector
        )
        try:
            response = await conn.send(make(conn.next_txn_id()), timeout)
        finally:
            conn.close()
        if isinstance(response, ErrorResponse):  # EPERM (TLS, role) or EBADREQ
            if unknown_ok and response.status is StatusCode.EBADREQ:
                return response
            raise status_error(response, address)
        return response

    try:
        return run_loop(run())
    except BKError as exc:
        raise click.ClickException(str(exc)) from None


@bookie_group.command("gc", help="Run a garbage collection pass on a running bookie now.")
@click.argument("address")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=600.0,
    show_default=True,
    help="Seconds to wait for the pass.",
)
@click.option(
    "--report",
    "report_only",
    is_flag=True,
    help="Run no pass: show each entry log's live and total bytes and why it is kept, and the "
    "pass running now, if any.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def gc_command(address: str, timeout: float, report_only: bool, as_json: bool) -> None:
    """Deleted ledgers are dropped and their entry logs removed or compacted (see
    docs/operations/disks.md); the bookie runs one pass every ``gc_interval``.
    Then the report: per entry log, its total and live bytes, what the next passes do with it
    (removed, compacted) or why they keep it (the active log, a live share at or above
    gc_compaction_threshold and the ledgers holding it, compaction off or stuck), and the
    bytes reclaimable now. With --json the pass's figures, and the report under "report"."""
    figures: dict[str, Any] = {}
    detail = ""
    if not report_only:
        response = _ask_bookie(address, GcRequest, timeout)
        if not isinstance(response, GcResponse) or response.status is not StatusCode.EOK:
            detail = response.detail if isinstance(response, GcResponse) else ""
            raise click.ClickException(f"{address}: {response.status.name}: {detail}")
        detail = response.detail
        figures = {
            "ledgers_deleted": response.ledgers_deleted,
            "logs_removed": response.logs_removed,
            "entries_moved": response.entries_moved,
            "bytes_freed": response.bytes_freed,
            "skipped": response.detail,
        }
    answer = _ask_bookie(address, GcReportRequest, min(timeout, 60.0), unknown_ok=True)
    report: dict[str, Any] | None = None
    if isinstance(answer, GcReportResponse):
        if answer.status is not StatusCode.EOK:
            raise click.ClickException(f"{address}: no report: {answer.report}")
        report = json.loads(answer.report)
    elif report_only:  # an older bookie answered EBADREQ to a request it does not know
        raise click.ClickException(
            f"{address} does not know the garbage collection report (a bookie older than this "
            f"command): `aiobk bookie gc {address}` without --report runs a pass"
        )
    if as_json:
        click.echo(json.dumps({**figures, "report": report}))
    else:
        if figures:
            click.echo(
                f"{address}: {figures['ledgers_deleted']} deleted ledger(s) dropped, "
                f"{figures['logs_removed']} entry log(s) removed, {figures['entries_moved']} "
                f"entries moved, {figures['bytes_freed']} bytes freed"
            )
        if report is None:
            click.echo(f"{address}: no report (a bookie older than this command)")
        else:
            _print_gc_report(report)
    if detail:
        raise click.ClickException(f"{address}: the pass stopped early: {detail}")


def _print_gc_report(report: dict[str, Any]) -> None:
    rows = []
    for entry in report["logs"]:
        share = entry["live_share"]
        live = ("~" if entry["live_bytes_estimated"] else "") + format_size(entry["live_bytes"])
        why = entry["reason"]
        if entry["kept_by"]:
            held = ", ".join(f"{k['ledger_id']} ({k['ledger']})" for k in entry["kept_by"])
            why += f"; kept by ledger {held}"
        share_text = "-" if share is None else f"{share:.0%}"
        reclaimable = format_size(entry["reclaimable_bytes"])
        total = format_size(entry["total_bytes"])
        rows.append((entry["file"], total, live, share_text, reclaimable, entry["state"], why))
    click.echo(
        f"entry logs: {format_size(report['total_bytes'])} in all, "
        f"{format_size(report['live_bytes'])} live, "
        f"{format_size(report['reclaimable_bytes'])} reclaimable by the next passes "
        f"(gc_compaction_threshold {report['compaction_threshold']:g})"
    )
    echo_table(rows, ("log", "total", "live", "live%", "reclaimable", "state", "why"))
    total = report.get("logs_total", len(rows))
    if total > len(rows):
        click.echo(
            f"({len(rows)} of {total} entry logs shown: those with the most to reclaim, then "
            "the largest; the totals count them all)"
        )
    running = report.get("running")
    if running:
        line = f"a pass is running: {running['phase']}"
        if running["compacting_log"] is not None:
            line += (
                f", log {running['compacting_log']:08x} ({running['logs_compacted'] + 1} of "
                f"{running['logs_to_compact']}): "
                f"{format_size(running['compacting_bytes_scanned'])} of "
                f"{format_size(running['compacting_log_bytes'])} read, {running['entries_moved']} "
                "entries moved"
            )
        click.echo(line)


@bookie_group.command("state", help="Show a running bookie's state, or force it read-only.")
@click.argument("address")
@click.option("--readonly", "change", flag_value="readonly", help="Refuse adds from now on.")
@click.option("--writable", "change", flag_value="writable", help="Lift --readonly.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the bookie's answer.",
)
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
