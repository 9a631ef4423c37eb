"""The offload work list's upkeep: releases once the deletion lag has passed, attempts that
died taken back, and entries of ledgers that are gone dropped.

The work list (metadata, ``list_offloading``) names every ledger with an offload record or an
attempt about to record one. The autorecovery leader walks it every pass
(``AutoRecovery``'s offload pass); ``aiobk log offload`` releases its own ledgers at once when
the lag is 0. Every change is a compare-and-set on the ledger's metadata, so two passes, or a
pass and an offloader, never undo each other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiobk.client.context import ClientContext
from aiobk.client.offload.copy import DEFAULT_STALE_AFTER, release, take_back
from aiobk.metadata import OffloadState, OffloadStoreSettings
from aiobk.protocol.errors import NoSuchLedgerError
from aiobk.tiered.objects import ledger_prefix
from aiobk.tiered.open import StoreCache
from aiobk.tiered.store import ObjectStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class UpkeepReport:
    """What one pass over the work list did."""

    released: list[int]
    abandoned: list[int]  # attempts that died, their objects deleted and records cleared
    dropped: list[int]  # work-list entries of ledgers deleted (their objects too) or never recorded


async def upkeep(
    ctx: ClientContext,
    objects: StoreCache,
    settings: OffloadStoreSettings | None,
    *,
    now: Callable[[], float],
    stale_after: float = DEFAULT_STALE_AFTER,
) -> UpkeepReport:
    """One pass over the work list (see the module docstring). ``settings`` None (no store
    set) still drops entries and takes back dead attempts, and releases by the default lag
    of nothing: a copied ledger is released only under a store's deletion lag."""
    report = UpkeepReport([], [], [])
    now_ms = int(now() * 1000)
    async for ledger_id in ctx.store.list_offloading():
        try:
            metadata = await ctx.store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            # Deleted without its object (a forced delete, or a crash between the two):
            # whatever the current store holds of it goes now, the rest at the next sweep.
            if settings is not None:
                await drop_objects(objects.get(settings.url), ledger_id)
            await ctx.store.remove_offloading(ledger_id)
            report.dropped.append(ledger_id)
            continue
        record = metadata.offload
        if record is None:
            if await _drop_if_unrecorded(ctx, ledger_id, now_ms, stale_after):
                report.dropped.append(ledger_id)
        elif record.state is OffloadState.COPYING:
            if now_ms - record.started >= stale_after * 1000 and await take_back(
                ctx, objects, ledger_id, record
            ):
                report.abandoned.append(ledger_id)
        elif record.state is OffloadState.COPIED and settings is not None:
            due = (record.copied or 0) + settings.deletion_lag * 1000
            if now_ms >= due and await release(ctx, objects, ledger_id, now=now):
                report.released.append(ledger_id)
    return report


async def drop_objects(store: ObjectStore, ledger_id: int) -> None:
    """Delete every object, and every unfinished upload, of a deleted ledger."""
    prefix = ledger_prefix(ledger_id)
    for upload in await store.uploads(prefix):
        await store.abort(upload)
    keys = [key async for key in store.keys(prefix)]
    for key in keys:
        await store.delete(key)


async def _drop_if_unrecorded(
    ctx: ClientContext, ledger_id: int, now_ms: int, stale_after: float
) -> bool:
    """A work-list entry whose ledger has no offload record: an offloader died between
    listing the ledger and recording its attempt, or is between the two now. The entry is
    dropped once its listing is ``stale_after`` old, and only at the revision read, so a
    ledger listed again meanwhile stays."""
    since = await ctx.store.offloading_since(ledger_id)
    if since is None:
        return False
    listed_at, revision = since
    if now_ms - listed_at < stale_after * 1000:
        return False
    return await ctx.store.remove_offloading(ledger_id, revision)


__all__ = ["UpkeepReport", "upkeep"]
