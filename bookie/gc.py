"""Garbage collection: reclaim the disk of deleted ledgers (BookKeeper's GarbageCollectorThread
with its scan-and-compare collector; entry-log compaction is not done yet).

``delete_ledger`` only removes a ledger's metadata; each bookie notices later. One pass:

1. Take the ids of the ledgers this bookie holds, *then* list the metadata store. A ledger's
   metadata exists before any bookie is sent its entries, so a ledger held here but missing
   from the later listing was deleted (ids are never reused).
2. Read each candidate's metadata once more and keep it unless the store says it does not
   exist. Ledgers in limbo wait while the boot repair (BP-46 phase two) runs. Any metadata
   error ends the pass having deleted nothing.
3. Drop the ledgers' state here and make the next index segment a full one, so a restart
   cannot bring them back from older segments.
4. Checkpoint (buffered entry logs are written out, older writers closed), note the complete
   entry logs (older than the one taking appends) and the logs some remaining ledger's index
   points into, checkpoint again (a full segment, durable), then remove every complete log
   nothing points into. Appends only ever go to the newest log, so after the look no index
   location can move *into* a complete log: the durable segment points into none of them
   but those noted.

An entry log is removed whole, once every ledger with entries in it is gone; a log shared
with a live ledger stays (compaction, which would copy the live entries out, is future work).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bookie.entrylog import OFFSET_BITS
from bookie.ledger import LedgerState
from metadata import MetadataStore
from protocol.errors import BKError, NoSuchLedgerError

if TYPE_CHECKING:
    from bookie.server import Bookie

log = logging.getLogger(__name__)

PAGES_PER_YIELD = 16  # ~2 ms of work between yields to the event loop


@dataclass
class GcResult:
    """What one pass did."""

    ledgers_deleted: list[int] = field(default_factory=list)
    logs_removed: list[int] = field(default_factory=list)
    bytes_freed: int = 0
    skipped: str = ""  # why the pass stopped early, if it did


def garbage_candidates(held: Iterable[int], listed: Iterable[int]) -> set[int]:
    """Ledgers held here that the (later) listing of the metadata store did not name."""
    return set(held) - set(listed)


def removable_logs(complete: Iterable[int], referenced: set[int]) -> list[int]:
    """Complete entry logs that no ledger's index points into, oldest first."""
    return sorted(set(complete) - referenced)


def page_logs(page: Iterable[int]) -> set[int]:
    """The entry logs the locations of one index page point into (-1: no entry)."""
    return {location >> OFFSET_BITS for location in page if location >= 0}


async def referenced_logs(ledgers: Iterable[LedgerState]) -> set[int]:
    """Every entry log some ledger's index points into, yielding to the loop as it goes."""
    logs: set[int] = set()
    pages = 0
    for state in list(ledgers):
        for page in list(state.pages.values()):
            logs |= page_logs(page)
            pages += 1
            if pages % PAGES_PER_YIELD == 0:
                await asyncio.sleep(0)
    return logs


async def collect(bookie: Bookie, store: MetadataStore) -> GcResult:
    """One garbage-collection pass (see the module's docstring)."""
    result = GcResult()
    storage = bookie.storage
    held = list(storage.ledgers)  # before the listing: see step 1
    try:
        listed = [ledger_id async for ledger_id in store.list_ledgers()]
        doomed = []
        for ledger_id in sorted(garbage_candidates(held, listed)):
            state = storage.ledgers.get(ledger_id)
            if state is None or (state.limbo and bookie.repairing):
                continue  # the boot repair works on limbo ledgers; a deleted one it skips
            try:
                await store.read_ledger(ledger_id)
            except NoSuchLedgerError:
                doomed.append(ledger_id)
    except BKError as exc:  # MetadataStoreError and the like: delete nothing this time
        result.skipped = f"metadata store: {exc}"
        return result
    for ledger_id in doomed:
        if storage.delete_ledger(ledger_id):
            result.ledgers_deleted.append(ledger_id)
    try:
        await bookie.checkpoint()  # writes out buffered logs, so that they can be complete
        complete = await storage.entry_logger.complete_logs()
        referenced = await referenced_logs(storage.ledgers.values())
        await bookie.checkpoint()  # a full segment: durable references are within `referenced`
    except OSError as exc:
        result.skipped = f"checkpoint failed: {exc}"
        return result
    for log_id in removable_logs(complete, referenced):
        try:
            result.bytes_freed += await storage.entry_logger.remove_log(log_id)
        except OSError as exc:
            log.warning("bookie %s: cannot remove entry log %x: %s", bookie.bookie_id, log_id, exc)
            continue
        result.logs_removed.append(log_id)
    bookie.stats.gc_ledgers_deleted += len(result.ledgers_deleted)
    bookie.stats.gc_logs_removed += len(result.logs_removed)
    bookie.stats.gc_bytes_freed += result.bytes_freed
    if result.ledgers_deleted or result.logs_removed:
        log.info(
            "bookie %s: gc deleted %d ledger(s), removed %d entry log(s), %d bytes",
            bookie.bookie_id,
            len(result.ledgers_deleted),
            len(result.logs_removed),
            result.bytes_freed,
        )
    return result
