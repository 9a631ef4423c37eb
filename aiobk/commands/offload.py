"""``aiobk offload store|sweep``, and what ``aiobk log offload`` shares with them: the cluster's
object store for offloaded ledgers, the sweep of what no metadata names, and an offload's
report as a table or one JSON document.

Setting a store opens it and probes it first (an object put under ``probe/``, read back and
deleted, every call bounded by the store's timeout): a wrong URL, missing keys or an
unreachable store fail the command in one line and leave the setting as it was, rather than
failing the first offload hours later. The setting records the store's own form of the URL
(``ObjectStore.url``), the one every offload record and the sweep compare against.

``AIOBK_TEST_OFFLOAD_PAUSE=POINT`` (one of ``aiobk.client.offload.POINTS``) makes ``aiobk log
offload`` stop for good at that point of its first ledger's offload, after printing
``aiobk: offload paused at POINT`` on stderr: the hook the process-kill tests stop it by.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final

import click

from aiobk.client.bookkeeper import BookKeeper
from aiobk.client.log.position import LogPosition
from aiobk.client.offload import POINTS, OffloadReport, Steps, SweepReport, offload_ledger, sweep
from aiobk.commands.common import (
    json_option,
    metadata_option,
    parse_duration,
    run_with_client,
    run_with_store,
)
from aiobk.commands.records import format_time
from aiobk.commands.text import echo_table, format_duration, format_size
from aiobk.metadata import MetadataStore, OffloadStoreSettings
from aiobk.metadata.records import DEFAULT_DELETION_LAG
from aiobk.protocol.errors import BKError, NoOffloadStoreError, ObjectStoreError
from aiobk.tiered.open import open_object_store, redact
from aiobk.tiered.store import ObjectStore

PAUSE_ENV: Final = "AIOBK_TEST_OFFLOAD_PAUSE"
PROBE_PREFIX: Final = "probe/"
NO_STORE: Final = "no offload store is set for this cluster: set one with `aiobk offload store URL`"


@click.group(name="offload", help="The cluster's object store for offloaded ledgers.")
def offload_group() -> None:
    pass


# ------------------------------------------------------------------------------------ the store


def _settings_document(settings: OffloadStoreSettings) -> dict[str, Any]:
    return {
        "url": redact(settings.url),
        "deletion_lag": settings.deletion_lag,
        "set_at": settings.set_at,
    }


def _print_settings(settings: OffloadStoreSettings) -> None:
    echo_table(
        [
            ("url", redact(settings.url)),
            ("deletion lag", format_duration(settings.deletion_lag)),
            ("set at", format_time(settings.set_at)),
        ]
    )


async def probe(store: ObjectStore) -> None:
    """Put a small object under ``probe/``, read it back and delete it; ``ObjectStoreError``
    (one line) when any step fails or the bytes read back differ."""
    key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    payload = f"aiobk offload store probe {key}".encode()

    async def chunks() -> AsyncIterator[bytes]:
        yield payload

    await store.put(key, chunks())
    try:
        back = await store.get_range(key, 0, len(payload))
    finally:
        await store.delete(key)
    if back != payload:
        raise ObjectStoreError(f"{redact(store.url)}: the probe object read back differs")


def _open(url: str) -> ObjectStore:
    try:
        return open_object_store(url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'URL'") from None


@offload_group.command(
    "store",
    help="Show the cluster's offload store, or set it to URL: file:///DIR or "
    "s3://BUCKET/PREFIX?endpoint=URL&region=R (S3 keys from AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY). The store is probed first (a small object put, read back and "
    "deleted); nothing is set unless it answers. A new store takes new offloads only: each "
    "offloaded ledger's metadata names the store that holds it.",
)
@click.argument("url", required=False)
@click.option(
    "--deletion-lag", callback=parse_duration, default=None, metavar="DURATION",
    help="How long a copied ledger stays on its bookies too before they may drop it "
    "(90s, 30m, 4h, 1d; 0: at once). Default: the current setting's, else 4h.",
)  # fmt: skip
@metadata_option
@json_option
def store_command(
    url: str | None, deletion_lag: float | None, metadata: str | None, as_json: bool
) -> None:
    if url is None:
        if deletion_lag is not None:
            raise click.UsageError("--deletion-lag is set with the store's URL")
        found = run_with_store(metadata, lambda store: store.read_offload_store())
        if as_json:
            click.echo(json.dumps(None if found is None else _settings_document(found)))
        elif found is None:
            click.echo(NO_STORE)
        else:
            _print_settings(found)
        return
    objects = _open(url)

    async def action(store: MetadataStore) -> OffloadStoreSettings:
        try:
            await probe(objects)
        except BKError as exc:
            raise click.ClickException(f"the store failed its probe, nothing set: {exc}") from None
        finally:
            await objects.close()
        current = await store.read_offload_store()
        lag = deletion_lag
        if lag is None:
            lag = current.deletion_lag if current is not None else DEFAULT_DELETION_LAG
        settings = OffloadStoreSettings(objects.url, lag, set_at=int(time.time() * 1000))
        await store.set_offload_store(settings)
        return settings

    settings = run_with_store(metadata, action)
    if as_json:
        click.echo(json.dumps(_settings_document(settings)))
    else:
        click.echo(
            f"offload store set: {redact(settings.url)} "
            f"(deletion lag {format_duration(settings.deletion_lag)})"
        )


# ------------------------------------------------------------------------------------ the sweep


def _sweep_document(url: str, dry_run: bool, report: SweepReport) -> dict[str, Any]:
    return {
        "store": redact(url),
        "dry_run": dry_run,
        "objects": report.objects,
        "uploads": report.uploads,
        "kept": report.kept,
        "foreign": report.foreign,
    }


@offload_group.command(
    "sweep",
    help="Remove the objects and unfinished uploads in the cluster's offload store that no "
    "ledger's metadata names (left by deleted ledgers, and by offloads that were killed or "
    "superseded). The autorecovery leader runs it every offload_sweep_interval.",
)
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@metadata_option
@json_option
def sweep_command(dry_run: bool, metadata: str | None, as_json: bool) -> None:
    async def action(bk: BookKeeper) -> tuple[str, SweepReport]:
        settings = await bk.store.read_offload_store()
        if settings is None:
            raise NoOffloadStoreError(NO_STORE)
        try:
            store = bk.objects.get(settings.url)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        return settings.url, await sweep(bk.context, store, dry_run=dry_run)

    url, report = run_with_client(metadata, action)
    if as_json:
        click.echo(json.dumps(_sweep_document(url, dry_run, report)))
        return
    verb = "would remove" if dry_run else "removed"
    for key in report.objects:
        click.echo(f"{verb} object {key}")
    for key in report.uploads:
        click.echo(f"{verb} unfinished upload {key}")
    for key in report.foreign:
        click.echo(f"left {key} (not an offload object)")
    click.echo(
        f"sweep of {redact(url)}{' (dry run)' if dry_run else ''}: {verb} "
        f"{len(report.objects)} objects and {len(report.uploads)} unfinished uploads; "
        f"{report.kept} objects kept"
    )


# ----------------------------------------------------------------------------- a log's offload


class _PauseAt(Steps):
    """Stops the offload for good at ``point``, after saying so on stderr."""

    def __init__(self, point: str) -> None:
        self.point = point

    async def at(self, point: str) -> None:
        if point == self.point:
            click.echo(f"aiobk: offload paused at {point}", err=True)
            await asyncio.Event().wait()


def pause_point() -> str | None:
    """The point ``AIOBK_TEST_OFFLOAD_PAUSE`` names (None: unset); a usage error otherwise."""
    point = os.environ.get(PAUSE_ENV) or None
    if point is not None and point not in POINTS:
        raise click.UsageError(f"{PAUSE_ENV}={point}: not one of {', '.join(POINTS)}")
    return point


async def offload_log_paused(
    bk: BookKeeper, name: str, before: LogPosition | None, password: bytes | None, point: str
) -> OffloadReport:
    """``bk.offload_log``'s work done through the same ``offload_ledger``, one ledger at a
    time, with steps that stop at ``point``."""
    settings = await bk.store.read_offload_store()
    if settings is None:
        raise NoOffloadStoreError(NO_STORE)
    ledgers = list((await bk.store.read_log(name)).ledgers)
    if before is not None:
        if before.ledger_id not in ledgers:
            raise ValueError(f"log {name!r} has no ledger {before.ledger_id} (position {before})")
        ledgers = ledgers[: ledgers.index(before.ledger_id)]
    report = OffloadReport(name)
    for ledger_id in ledgers:
        report.ledgers.append(
            await offload_ledger(
                bk.context,
                bk.objects,
                settings,
                ledger_id,
                now=time.time,
                password=password,
                steps=_PauseAt(point),
            )
        )
    return report


def report_document(report: OffloadReport) -> dict[str, Any]:
    return {
        "log": report.log,
        "ledgers": [
            {
                "ledger_id": item.ledger_id,
                "outcome": item.outcome,
                "entries": item.entries,
                "bytes": item.size,
            }
            for item in report.ledgers
        ],
        "bytes": report.bytes,
    }


def print_report(report: OffloadReport) -> None:
    if report.ledgers:
        echo_table(
            [
                (str(item.ledger_id), item.outcome, str(item.entries), str(item.size))
                for item in report.ledgers
            ],
            headers=("ledger", "outcome", "entries", "bytes"),
        )
    outcomes: dict[str, int] = {}
    for item in report.ledgers:
        outcomes[item.outcome] = outcomes.get(item.outcome, 0) + 1
    counted = ", ".join(f"{count} {outcome}" for outcome, count in outcomes.items())
    click.echo(
        f"log {report.log}: {len(report.ledgers)} ledgers ({counted or 'none closed'}), "
        f"{report.bytes} bytes ({format_size(report.bytes)}) in the store"
    )


__all__ = [
    "PAUSE_ENV",
    "offload_group",
    "offload_log_paused",
    "pause_point",
    "print_report",
    "probe",
    "report_document",
]
