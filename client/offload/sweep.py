"""The sweep: objects and unfinished uploads in the store that no ledger's metadata names.

An offload names its object in the ledger's metadata before writing a byte of it, and a
ledger's deletion removes its metadata before its object. So an object is garbage exactly when
no metadata names it: its ledger is gone (deleted, or truncated out of its log, and the crash
came between the two steps), or the ledger's record names another attempt (a superseded or
taken-back one). An unfinished upload is garbage unless the attempt it belongs to is still
the one recorded and still copying. Nothing here needs a grace period.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from aiobk.client.context import ClientContext
from aiobk.metadata import LedgerMetadata, OffloadState
from aiobk.protocol.errors import NoSuchLedgerError
from aiobk.tiered.store import ObjectStore

log = logging.getLogger(__name__)

LEDGERS_PREFIX = "ledgers/"
_KEY = re.compile(r"ledgers/(\d{19})/[0-9a-f]{32}\.aobk")


@dataclass(slots=True)
class SweepReport:
    """What a sweep found (and, unless a dry run, removed)."""

    objects: list[str] = field(default_factory=list)  # keys of objects no metadata names
    uploads: list[str] = field(default_factory=list)  # keys of unfinished uploads
    kept: int = 0  # objects that metadata names
    foreign: list[str] = field(default_factory=list)  # keys not in the offload layout: left


async def sweep(ctx: ClientContext, store: ObjectStore, *, dry_run: bool = False) -> SweepReport:
    """Find (and remove, unless ``dry_run``) what no metadata names in ``store``."""
    report = SweepReport()
    known: dict[int, LedgerMetadata | None] = {}

    async def named(key: str, *, copying_only: bool) -> bool:
        match = _KEY.fullmatch(key)
        if match is None:
            return True  # not ours to judge
        ledger_id = int(match.group(1))
        if ledger_id in known and _names(known[ledger_id], key, copying_only):
            return True
        # Read afresh before judging: an attempt recorded since the last read names its
        # object before writing it, so a fresh read sees whatever a listing saw.
        try:
            known[ledger_id] = await ctx.store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            known[ledger_id] = None
        return _names(known[ledger_id], key, copying_only)

    async for key in store.keys(LEDGERS_PREFIX):
        if _KEY.fullmatch(key) is None:
            report.foreign.append(key)
        elif await named(key, copying_only=False):
            report.kept += 1
        else:
            report.objects.append(key)
            if not dry_run:
                await store.delete(key)
    for upload in await store.uploads(LEDGERS_PREFIX):
        if not await named(upload.key, copying_only=True):
            report.uploads.append(upload.key)
            if not dry_run:
                await store.abort(upload)
    if report.objects or report.uploads:
        log.info(
            "sweep of %s: %d objects and %d uploads no metadata names%s",
            store.url, len(report.objects), len(report.uploads),
            " (dry run)" if dry_run else ", removed",
        )  # fmt: skip
    return report


def _names(metadata: LedgerMetadata | None, key: str, copying_only: bool) -> bool:
    """Whether the ledger's record names the object ``key``. The key alone decides: it holds
    the attempt's uid, drawn afresh for every attempt, so no two attempts -- in this store or
    another -- share one, and a store URL written another way cannot make a named object
    look like garbage."""
    record = None if metadata is None else metadata.offload
    if record is None or record.key != key:
        return False
    return not copying_only or record.state is OffloadState.COPYING


__all__ = ["LEDGERS_PREFIX", "SweepReport", "sweep"]
