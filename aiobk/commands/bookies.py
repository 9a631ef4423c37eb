"""``aiobk bookies list|decommission``: the bookies registered in the metadata store, and
draining one for good (the logic in ``aiobk.autorecovery.decommission``)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import click

from aiobk.autorecovery.decommission import (
    STATE_TIMEOUT,
    Decommission,
    DecommissionError,
    DecommissionResult,
)
from aiobk.autorecovery.decommission import Progress as DrainProgress
from aiobk.autorecovery.decommission import cancel as cancel_decommission
from aiobk.autorecovery.roster import RosterEntry, gather_roster
from aiobk.client.connection import BookieConnection
from aiobk.commands.common import client_connector, json_option, metadata_option, run_with_store
from aiobk.commands.text import ProgressLine, echo_table, progress_line
from aiobk.metadata import MetadataStore
from aiobk.protocol import BookieStateRequest, StateChange


@click.group(name="bookies", help="The bookies registered in the metadata store.")
def bookies_group() -> None:
    pass


@bookies_group.command(
    "list",
    help="List the bookies: the registered ones (writable or read-only) with when each was last "
    "heard from, then the lost ones (a cookie or the auditor knows them; not registered).",
)
@metadata_option
@json_option
def bookies_list(metadata: str | None, as_json: bool) -> None:
    now = time.time()
    entries = run_with_store(metadata, lambda store: gather_roster(store, int(now * 1000)))
    if as_json:
        click.echo(json.dumps([entry.to_document() for entry in entries]))
        return
    rows = [
        (
            entry.bookie_id,
            entry.address,
            entry.rack or "-",
            entry.state,
            f"{entry.free_bytes / 2**30:.1f}" if entry.registered else "-",
            entry.software_version or "-",
            _heard(entry, now),
        )
        for entry in entries
    ]
    echo_table(rows, ("id", "address", "rack", "state", "free GiB", "version", "last heard"))


def _heard(entry: RosterEntry, now: float) -> str:
    """When a bookie was last heard from, as the table shows it."""
    if entry.registered:
        if entry.last_heard is None:
            return "-"
        ago = f"{max(0.0, now - entry.last_heard / 1000):.0f}s ago"
        return f"{ago} (late: dead or cut off?)" if entry.late else ago
    if entry.absent_since is None:
        return "not registered"
    at = datetime.fromtimestamp(entry.absent_since / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"absent since {at}"


@bookies_group.command(
    "decommission", short_help="Drain a bookie (live or dead) for good, then remove it."
)
@click.argument("bookie_id")
@metadata_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=3600.0,
    show_default=True,
    help="Seconds to wait for the drain, and as long again for a live bookie to be stopped.",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between looks at the ledgers still naming the bookie.",
)
@click.option(
    "--cancel", is_flag=True, help="Stop draining BOOKIE_ID and lift its read-only state."
)
@json_option
def decommission_command(
    bookie_id: str, metadata: str | None, timeout: float, poll_interval: float, cancel: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Drain a bookie for good, live or dead, then remove its cookie.

    Every ledger naming BOOKIE_ID is marked for the replication workers (in the bookies, or
    `aiobk autorecovery start`), which copy its entries to other bookies -- reading from it
    while it lives -- and take it out of the ledger's ensembles. A live bookie is set
    read-only first so that new ledgers avoid it. Progress (the ledgers still naming it) is
    shown on stderr, with the first few of them and what holds each (as `aiobk autorecovery
    explain` says): looked at every 10 s, shown when it changes and each minute otherwise.

    Once no ledger names it, a bookie that is still running is reported drained and the
    command waits (up to --timeout again) for you to stop it: its cookie is removed only once
    it has left the registry, since a running bookie would still answer for it. Then its
    cookie and the decommissioning mark are deleted.

    Refused at once when the bookie is unknown, when some ledger's fragment has no writable
    bookie outside its ensemble to take the copies, and (while some ledger names it) when
    autorecovery is disabled or no autorecovery process runs (no auditor elected within 15 s).
    A timeout or Ctrl-C leaves the bookie marked for draining (its copies keep moving): run
    the command again to wait, or --cancel to stop. Open ledgers naming it are fenced and
    closed after open_ledger_rereplication_grace_period if their writer does not move off it
    first.
    """
    if cancel:
        _cancel(metadata, bookie_id, as_json)
        return
    reporter = _DrainReporter(bookie_id, None if as_json else progress_line())

    runs: list[Decommission] = []
    connector = client_connector()

    async def set_state(address: str, change: StateChange) -> None:
        # ``ask_bookie_state`` over this command's TLS, when it has TLS (--tls-*).
        host, _sep, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise DecommissionError(f"bookie address {address!r} is not host:port")
        conn = await BookieConnection.open(
            host, int(port), timeout=STATE_TIMEOUT, connector=connector
        )
        try:
            await conn.call(BookieStateRequest(0, change), STATE_TIMEOUT)
        finally:
            conn.close()

    async def action(store: MetadataStore) -> DecommissionResult:
        run = Decommission(
            store,
            bookie_id,
            timeout=timeout,
            wall_clock=time.time,
            notify=reporter.notify,
            poll_interval=poll_interval,
            set_state=set_state,
        )
        runs.append(run)
        return await run.run()

    try:
        with reporter:
            result = run_with_store(metadata, action)
    except DecommissionError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        if runs and runs[0].draining:
            click.echo(
                f"interrupted: {bookie_id} stays marked for draining and its copies keep "
                "moving; run the command again to finish, or with --cancel to stop",
                err=True,
            )
        raise click.Abort() from None
    lost = [ledger.to_document() for ledger in result.lost]
    if as_json:
        document = {
            "bookie_id": bookie_id,
            "ledgers": result.ledgers,
            "was_running": result.was_registered,
            "cookie_removed": result.cookie_removed,
            "lost_ledgers": lost,
        }
        click.echo(json.dumps(document))
    else:
        cookie = "cookie removed" if result.cookie_removed else "it had no cookie"
        click.echo(
            f"bookie {bookie_id} decommissioned: {result.ledgers} ledger(s) re-replicated, {cookie}"
        )
    for ledger in result.lost:
        ranges = ", ".join(f"{a}-{b}" for a, b in ledger.ranges)
        click.echo(
            f"warning: ledger {ledger.ledger_id}: entries {ranges} had no copy left on any "
            "bookie (lost)",
            err=True,
        )


def _cancel(metadata: str | None, bookie_id: str, as_json: bool) -> None:
    done = run_with_store(metadata, lambda store: cancel_decommission(store, bookie_id))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "bookie_id": bookie_id,
                    "was_decommissioning": done.was_draining,
                    "asked_writable": done.asked_writable,
                    "problem": done.problem,
                }
            )
        )
    elif not done.was_draining:
        click.echo(f"{bookie_id} was not being decommissioned")
    else:
        click.echo(f"{bookie_id} is no longer being decommissioned")
    if done.problem is not None:
        raise click.ClickException(
            f"could not make {bookie_id} writable again ({done.problem}): use "
            "`aiobk bookie state HOST:PORT --writable`"
        )


class _DrainReporter:
    """Shows a decommission's progress on stderr: a line redrawn in place on a terminal, else a
    line whenever the count of ledgers still naming the bookie changes (at most every few
    seconds)."""

    LINE_EVERY = 5.0
    EXPLAIN_EVERY = 60.0

    def __init__(self, bookie_id: str, live: ProgressLine | None) -> None:
        self._bookie_id = bookie_id
        self._live = live
        self._shown: tuple[str, int] | None = None
        self._shown_at = 0.0
        self._explained: tuple[tuple[int, str], ...] = ()  # (ledger, kind) last explained
        self._explained_at = 0.0

    def __enter__(self) -> _DrainReporter:
        if self._live is not None:
            self._live.__enter__()
            self._live.show(f"draining {self._bookie_id}", now=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _say(self, line: str) -> None:
        if self._live is not None:
            self._live.note(line)
        else:
            click.echo(line, err=True)

    def notify(self, progress: DrainProgress) -> None:
        if progress.note is not None:
            self._say(progress.note)
        # Shown when what holds them changes, and again each minute while nothing does.
        holds = tuple((ledger.ledger_id, ledger.kind) for ledger in progress.left)
        now = time.monotonic()
        if holds and (holds != self._explained or now - self._explained_at >= self.EXPLAIN_EVERY):
            self._explained, self._explained_at = holds, now
            for ledger in progress.left:
                self._say(f"  ledger {ledger.ledger_id} not done: {ledger.reason}")
            more = progress.remaining - len(progress.left)
            if more > 0:
                self._say(
                    f"  and {more} more (`aiobk autorecovery explain LEDGER_ID` for any of them)"
                )
        moved = progress.total - progress.remaining
        if self._live is not None:
            self._live.show(
                f"{progress.stage} {self._bookie_id}: {progress.remaining} ledger(s) still name "
                f"it ({moved}/{progress.total} done)"
            )
            return
        key = (progress.stage, progress.remaining)
        now = time.monotonic()
        final = progress.remaining == 0
        if key != self._shown and (final or now - self._shown_at >= self.LINE_EVERY):
            self._shown, self._shown_at = key, now
            click.echo(
                f"{progress.stage} {self._bookie_id}: {progress.remaining} of "
                f"{progress.total} ledger(s) still name it",
                err=True,
            )
