"""``aiobk autorecovery start|status|list-underreplicated|explain|trigger-audit|disable|
enable``: run autorecovery on its own, and see and steer what it does cluster-wide.

Every bookie runs autorecovery beside it by default (``autorecovery_enabled``); ``start`` is for
clusters that keep it apart (bookies with ``autorecovery_enabled = false``, as BookKeeper's
separate AutoRecovery daemons), or that want more workers. The other commands only read or
write the metadata store (``aiobk.autorecovery.status``), so they answer whichever process
audits, and while none does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from aiobk.autorecovery import AutoRecovery, AutoRecoveryConfig, Explanation, explain_ledger
from aiobk.autorecovery.status import (
    MarkedLedger,
    StatusReport,
    gather_status,
    under_replicated,
)
from aiobk.bookie.config import BookieConfig, ConfigError
from aiobk.client.config import ClientConfig
from aiobk.client.pool import BookiePool
from aiobk.commands.common import (
    QuietPipeGroup,
    client_connector,
    json_option,
    metadata_option,
    run_loop,
    run_with_store,
)
from aiobk.commands.extras import require_extras
from aiobk.commands.text import echo_table
from aiobk.logging_setup import LOG_LEVELS, configure_logging
from aiobk.metadata import MetadataFormatError, MetadataStore, MetadataURIError, open_store
from aiobk.protocol.errors import BKError

# BookieConfig requires a data directory; a standalone autorecovery process has none.
_NO_DATA_DIR = "(not used by autorecovery)"


@click.group(
    name="autorecovery",
    cls=QuietPipeGroup,
    help="Autorecovery: re-replicate the copies of lost bookies (status, switches, a "
    "standalone process).",
)
def autorecovery_group() -> None:
    pass


# ---------------------------------------------------------------------------------------- start


def _settings(config_file: str | None, overrides: dict[str, Any]) -> BookieConfig:
    """The bookie settings that autorecovery takes, from a bookie's TOML and the flags (which
    win), checked as a bookie checks them: an unknown key or a bad value is an error."""
    overrides = {**overrides, "data_dir": _NO_DATA_DIR}
    try:
        if config_file is not None:
            return BookieConfig.from_toml(config_file, **overrides)
        return BookieConfig.from_mapping({}, **overrides)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def _node_id() -> str:
    return f"autorecovery-{socket.gethostname()}-{os.getpid()}"


@autorecovery_group.command("start", short_help="Run a worker and auditor candidate until SIGTERM.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A bookie's TOML file: its [autorecovery] table, metadata_uri and log_level are "
    "used, other bookie settings ignored; an unknown key is an error.",
)
@metadata_option
@click.option("--id", "node_id", default=None, help="Name in elections and claims.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address of the exporter."
)
@click.option("--lost-bookie-recovery-delay", type=float, default=None, help="Seconds.")
@click.option("--auditor-periodic-check-interval", type=float, default=None, help="0: never.")
@click.option("--open-ledger-rereplication-grace-period", type=float, default=None)
@click.option("--rereplication-max-bytes-per-second", type=int, default=None, help="0: no cap.")
@click.option("--rereplication-retry-delay", type=float, default=None)
@click.option("--autorecovery-poll-interval", type=float, default=None)
@click.option("--autorecovery-lease-ttl", type=float, default=None)
@click.option(
    "--min-racks-per-write-quorum",
    type=click.IntRange(1),
    default=None,
    help="Racks each write set should span; 1: no placement check.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="Log at this level and above to stderr (default: log_level in --config, else info).",
)
@json_option
def start_command(
    config_file: str | None,
    metadata: str | None,
    node_id: str | None,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Run a standalone autorecovery process -- a replication worker, and a candidate for
    auditor -- until SIGTERM or SIGINT.

    Settings are a bookie's: the `[autorecovery]` table of its TOML file (`--config`), whose
    keys the flags share; flags win over the file.
    The process is named `autorecovery-HOST-PID` unless `--id` is given; it prints one line
    once it runs, and `--metrics-port` exports its figures to Prometheus as
    `aiobk_autorecovery_*`. Settings `autorecovery_enabled` and `metrics_port` in the file
    are the bookie's own and are ignored here; `aiobk autorecovery disable` pauses every
    worker, this one included.
    """
    require_extras("aiobk autorecovery start", "bookie")
    config = _settings(config_file, {"metadata_uri": metadata, **flags})
    uri = config.metadata_uri
    if not uri:
        raise click.UsageError(
            "--metadata (or AIOBK_METADATA, or metadata_uri in --config) is required"
        )
    recovery_config = config.autorecovery
    name = node_id or _node_id()
    configure_logging(log_level or config.log_level)
    try:
        run_loop(_serve(uri, recovery_config, name, metrics_host, metrics_port, as_json))
    except MetadataURIError as exc:
        raise click.UsageError(str(exc)) from None
    except (BKError, MetadataFormatError) as exc:
        raise click.ClickException(f"cannot start autorecovery: {exc}") from None


async def _serve(
    uri: str,
    config: AutoRecoveryConfig,
    node_id: str,
    metrics_host: str,
    metrics_port: int | None,
    as_json: bool,
) -> None:
    connector = client_connector()  # its certificate should carry the bookie role
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    store = open_store(uri)
    try:
        # One read first: an unreachable store is an error now, not a warning every poll.
        enabled = await store.autorecovery.enabled()
        service = AutoRecovery(
            store,
            config,
            node_id,
            connector=connector,
            wall_clock=time.time,
            secret_bytes=os.urandom,
        )
        if metrics_port is not None:
            from aiobk.metrics import serve_autorecovery_metrics  # noqa: PLC0415 - bookie extra

            try:
                serve_autorecovery_metrics(
                    service.stats, node_id, metrics_host, metrics_port, store
                )
            except OSError as exc:
                raise click.ClickException(
                    f"cannot serve metrics on {metrics_host}:{metrics_port}: {exc.strerror}"
                ) from None
        await service.start()
        try:
            if as_json:
                document = {"node_id": node_id, "metadata": store.uri, "enabled": enabled}
                click.echo(json.dumps(document))
            else:
                click.echo(f"autorecovery {node_id} running on {store.uri}")
            sys.stdout.flush()
            if not enabled:
                click.echo(
                    "autorecovery is disabled cluster-wide: the worker waits for "
                    "`aiobk autorecovery enable`",
                    err=True,
                )
            await stop.wait()
            click.echo("stopping", err=True)
        finally:
            await service.stop()
    finally:
        await store.close()


# --------------------------------------------------------------------------------------- status


def _when(ms: int | None, now: float) -> str:
    if not ms:
        return "never"
    at = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{at} ({_age(now - ms / 1000)} ago)"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _ranges(ranges: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _print_status(report: StatusReport) -> None:
    now = time.time()
    click.echo(f"auditor: {report.auditor or 'none elected'}")
    click.echo(f"autorecovery: {'enabled' if report.enabled else 'disabled'}")
    if report.status_from is None:
        click.echo("auditor status: none published (no auditor, or one just elected)")
    for title, bookies in (
        ("lost bookies", report.lost_bookies),
        ("absent bookies (not lost yet)", report.absent_bookies),
    ):
        click.echo(f"{title}: {len(bookies) or 'none'}")
        for bookie, since in sorted(bookies.items()):
            click.echo(f"  {bookie}  absent since {_when(since, now)}")
    click.echo(f"under-replicated ledgers: {report.under_replicated}")
    click.echo(f"lost ledgers: {len(report.lost_ledgers)}")
    for ledger in report.lost_ledgers:
        click.echo(f"  ledger {ledger.ledger_id}: entries {_ranges(ledger.ranges)}")
    click.echo(f"last full check: {_when(report.last_check, now)}")
    click.echo(f"last lost-bookie check: {_when(report.last_bookie_check, now)}")
    click.echo(f"decommissioning: {', '.join(report.decommissioning) or 'none'}")


@autorecovery_group.command(
    "status", short_help="Auditor, lost bookies, ledger counts, check times."
)
@metadata_option
@json_option
def status_command(metadata: str | None, as_json: bool) -> None:
    """Show the auditor, whether autorecovery is enabled, lost and absent bookies, counts of
    under-replicated and lost ledgers (lost: entries no bookie has), when the auditor's
    checks last ran, and the bookies being decommissioned. Times in JSON are milliseconds
    since the epoch (null: never)."""
    report = run_with_store(metadata, gather_status)
    if as_json:
        click.echo(json.dumps(report.to_document()))
    else:
        _print_status(report)


@autorecovery_group.command(
    "list-underreplicated", short_help="The ledgers waiting for repair (--json: their ids)."
)
@metadata_option
@json_option
def list_command(metadata: str | None, as_json: bool) -> None:
    """List the ledgers waiting for repair: with --json a JSON array of their ids, else a
    table (the bookies whose copies are missing, since when, why, entries found lost, and the
    worker repairing it now)."""

    async def action(store: MetadataStore) -> list[MarkedLedger]:
        return await under_replicated(store, with_claims=not as_json)

    marked = run_with_store(metadata, action)
    if as_json:
        click.echo(json.dumps([m.mark.ledger_id for m in marked]))
        return
    if not marked:
        click.echo("no under-replicated ledgers")
        return
    now = time.time()
    rows = [
        (
            str(m.mark.ledger_id),
            ", ".join(m.mark.missing),
            _when(m.mark.since, now),
            ", ".join(m.mark.reasons),
            _ranges(m.mark.lost) or "-",
            m.claimed_by or "-",
        )
        for m in marked
    ]
    echo_table(rows, ("ledger", "missing", "since", "reasons", "lost entries", "worker"))


@autorecovery_group.command(
    "explain", short_help="Why a ledger is under-replicated, and what holds its repair."
)
@click.argument("ledger_id", type=click.IntRange(0, 2**63 - 1))
@metadata_option
@click.option(
    "--no-check",
    "no_check",
    is_flag=True,
    help="Do not ask the bookies what they hold (the store's view alone).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds for the whole explanation (each bookie read has 5 s).",
)
@json_option
def explain_command(
    ledger_id: int, metadata: str | None, no_check: bool, timeout: float, as_json: bool
) -> None:
    """Explain one ledger: whether it is under-replicated, which fragments and copies are
    missing (each bookie is asked about the first and last entries it owes, as the auditor's
    check does, unless --no-check), what holds its repair now -- autorecovery disabled or not
    running, a worker on it since when and how far, its throttle, an open ledger's grace
    period, no bookie outside an ensemble to copy to, no readable source copy, the last
    attempt's failure and when it is retried -- and what you can do. Exits 0 whatever the
    ledger's state; times in JSON are milliseconds since the epoch."""
    connector = None if no_check else client_connector()

    async def action(store: MetadataStore) -> Explanation:
        pool = None if no_check else BookiePool(store, ClientConfig(), connector)
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await explain_ledger(store, ledger_id, pool=pool)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise click.ClickException(
                f"no explanation within {timeout:g}s (the store or the bookies are slow to "
                "answer; --no-check skips the bookies)"
            ) from None
        finally:
            if pool is not None:
                await pool.close()

    explanation = run_with_store(metadata, action)
    if as_json:
        click.echo(json.dumps(explanation.to_document()))
    else:
        for line in explanation.lines():
            click.echo(line)


# ------------------------------------------------------------------------------------- switches


@autorecovery_group.command(
    "trigger-audit", short_help="Ask the auditor for a full check of every ledger now."
)
@metadata_option
@json_option
def trigger_command(metadata: str | None, as_json: bool) -> None:
    """Ask the auditor for a full check of every ledger now (it asks the bookies whether they
    hold what the ledgers say they do, and marks what is missing). An error when no auditor is
    elected: a newly elected one does not act on earlier requests."""

    async def action(store: MetadataStore) -> dict[str, Any] | None:
        recovery = store.autorecovery
        auditor = await recovery.auditor()
        if auditor is None:
            return None
        revision = await recovery.request_audit()
        return {"auditor": auditor, "revision": revision, "enabled": await recovery.enabled()}

    done = run_with_store(metadata, action)
    if done is None:
        raise click.ClickException(
            "no auditor is elected, so no check would run: start bookies with "
            "autorecovery_enabled, or `aiobk autorecovery start`"
        )
    if as_json:
        click.echo(json.dumps(done))
        return
    click.echo(f"audit requested: auditor {done['auditor']} checks every ledger now")
    if not done["enabled"]:
        click.echo("autorecovery is disabled: what it marks waits for `aiobk autorecovery enable`")


def _switch(metadata: str | None, enabled: bool, as_json: bool) -> None:
    async def action(store: MetadataStore) -> bool:
        was = await store.autorecovery.enabled()
        await store.autorecovery.set_enabled(enabled)
        return was

    was = run_with_store(metadata, action)
    if as_json:
        click.echo(json.dumps({"enabled": enabled, "was_enabled": was}))
    elif enabled:
        click.echo(
            "autorecovery enabled: workers repair marked ledgers"
            + (" again" if not was else " (it was already enabled)")
        )
    else:
        click.echo(
            "autorecovery disabled: workers take no more ledgers (a repair under way "
            "finishes); the auditor still marks them"
            + (" (it was already disabled)" if not was else "")
        )


@autorecovery_group.command("disable", short_help="Pause re-replication cluster-wide.")
@metadata_option
@json_option
def disable_command(metadata: str | None, as_json: bool) -> None:
    """Pause re-replication cluster-wide (say, during maintenance that stops bookies for a
    while): marks stay, and are repaired after `enable`."""
    _switch(metadata, False, as_json)


@autorecovery_group.command("enable", short_help="Resume re-replication.")
@metadata_option
@json_option
def enable_command(metadata: str | None, as_json: bool) -> None:
    """Resume re-replication after `disable`."""
    _switch(metadata, True, as_json)


__all__ = ["autorecovery_group"]
