"""Garbage collection: reclaim the disk of deleted ledgers (BookKeeper's GarbageCollectorThread
with its scan-and-compare collector, and compaction).

``delete_ledger`` only removes a ledger's metadata; each bookie notices later. One pass:

1. Walk the ids of the ledgers this bookie holds (from the index, ascending) beside the
   metadata store's listing (ascending, page by page). A ledger's metadata exists before any
   bookie is sent its entries, so a ledger held here but missing from the listing was deleted
   (ids are never reused); neither side is held whole in memory.
2. Read each candidate's metadata once more and keep it unless the store says it does not
   exist. Ledgers in limbo wait while the boot repair (BP-46 phase two) runs. Any metadata
   error ends the pass having deleted nothing.
3. Drop the ledgers here: their entries and state leave the index, a tombstone stays so no
   late request or replayed record brings them back.
4. On a disk short of space (the bookie read-only for it, or a pass forced by the warning
   threshold) the log taking appends is rolled first when it holds more than a write buffer:
   with the default 1 GiB logs a small disk's data may all sit in that one log, which no pass
   could otherwise touch. Note the log taking appends, checkpoint (buffered entry logs are
   written out, older writers closed), then take the complete entry logs older than the one
   noted -- their entries were all appended before the checkpoint sealed the index -- and,
   from the index's per-log ledger lists, those holding a ledger still held; checkpoint again
   (the deletions durable), then remove every such log whose ledgers are all gone. Appends
   only ever go to the newest log, so no index location can move *into* a complete log, and
   a deleted ledger never comes back.
5. Compaction (``bookie.compaction``, when ``gc_compaction_threshold`` > 0): complete logs
   that still hold live entries, but under that share of their records, have those entries
   copied to the active log; the emptied logs are removed as in step 4.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

from aiobk.bookie.compaction import compaction_candidates, log_usage, references, relocate
from aiobk.bookie.config import BookieConfig
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.metadata import MetadataStore
from aiobk.protocol.errors import BKError, NoSuchLedgerError

log = logging.getLogger(__name__)

COMPACT_LOGS_PER_PASS = 8  # bounds the copying one pass does
CONFIRM_AT_ONCE = 32  # metadata reads in flight while confirming deletions


@dataclass
class GcResult:
    """What one pass did."""

    ledgers_deleted: list[int] = field(default_factory=list)
    logs_removed: list[int] = field(default_factory=list)  # compacted ones included
    logs_compacted: list[int] = field(default_factory=list)
    entries_moved: int = 0
    bytes_freed: int = 0
    skipped: str = ""  # why the pass stopped early, if it did


def garbage_candidates(held: Iterable[int], listed: Iterable[int]) -> set[int]:
    """Ledgers held here that the (later) listing of the metadata store did not name."""
    return set(held) - set(listed)


async def unlisted(held: Iterator[int], listing: AsyncIterator[int]) -> list[int]:
    """``garbage_candidates`` of two ascending streams (this bookie's ids from its index, the
    store's listing page by page): a merge walk holding neither whole, only what it finds."""
    missing: list[int] = []
    mine = next(held, None)
    async for listed in listing:
        while mine is not None and mine < listed:
            missing.append(mine)  # passed over by the ascending listing: not in it
            mine = next(held, None)
        if mine is not None and mine == listed:
            mine = next(held, None)
    while mine is not None:
        missing.append(mine)
        mine = next(held, None)
    return missing


async def confirm_deleted(store: MetadataStore, candidates: list[int]) -> list[int]:
    """The candidates whose metadata the store says does not exist, read ``CONFIRM_AT_ONCE``
    at a time (one at a time, 100,000 deletions took 100 s of round trips). Any other error
    is raised: the pass then deletes nothing."""

    async def deleted(ledger_id: int) -> bool:
        try:
            await store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            return True
        return False

    doomed: list[int] = []
    for start in range(0, len(candidates), CONFIRM_AT_ONCE):
        chunk = candidates[start : start + CONFIRM_AT_ONCE]
        found = await asyncio.gather(*(deleted(i) for i in chunk), return_exceptions=True)
        for ledger_id, gone in zip(chunk, found, strict=True):
            if isinstance(gone, BaseException):
                raise gone
            if gone:
                doomed.append(ledger_id)
    return doomed


def removable_logs(complete: Iterable[int], referenced: set[int]) -> list[int]:
    """Complete entry logs that no ledger's index points into, oldest first."""
    return sorted(set(complete) - referenced)


class GarbageCollector:
    """Runs passes (see the module's docstring), one at a time."""

    def __init__(
        self,
        storage: LedgerStorage,
        config: BookieConfig,
        stats: BookieStats,
        checkpoint: Callable[[], Awaitable[None]],
    ) -> None:
        self.storage = storage
        self.config = config
        self.stats = stats
        self.checkpoint = checkpoint  # the bookie's: makes the index and entry logs durable
        self._lock = asyncio.Lock()

    async def collect(
        self, store: MetadataStore, owner: str, *, short_of_space: bool, keep_limbo: bool
    ) -> GcResult:
        """One pass. ``keep_limbo``: the boot repair still works on limbo ledgers."""
        async with self._lock:
            result = await self._collect(store, short_of_space, keep_limbo)
        stats = self.stats
        stats.gc_ledgers_deleted += len(result.ledgers_deleted)
        stats.gc_logs_removed += len(result.logs_removed)
        stats.gc_bytes_freed += result.bytes_freed
        stats.gc_entries_moved += result.entries_moved
        stats.gc_logs_compacted += len(result.logs_compacted)
        if result.ledgers_deleted or result.logs_removed:
            log.info(
                "bookie %s: gc deleted %d ledger(s), removed %d entry log(s) (%d compacted, %d "
                "entries moved), %d bytes",
                owner,
                len(result.ledgers_deleted),
                len(result.logs_removed),
                len(result.logs_compacted),
                result.entries_moved,
                result.bytes_freed,
            )
        return result

    async def _collect(
        self, store: MetadataStore, short_of_space: bool, keep_limbo: bool
    ) -> GcResult:
        result = GcResult()
        storage = self.storage
        try:
            candidates = []
            for ledger_id in await unlisted(storage.ledger_ids(), store.list_ledgers()):
                limbo = storage.limbo_of(ledger_id)
                if limbo is None or (limbo and keep_limbo):
                    continue  # the boot repair works on limbo ledgers; a deleted one it skips
                candidates.append(ledger_id)
            doomed = await confirm_deleted(store, candidates)
        except BKError as exc:  # MetadataStoreError and the like: delete nothing this time
            result.skipped = f"metadata store: {exc}"
            return result
        for ledger_id in doomed:
            if storage.delete_ledger(ledger_id):
                result.ledgers_deleted.append(ledger_id)
        logger = storage.entry_logger
        if short_of_space and logger.active_size > self.config.entry_log_write_buffer:
            logger.roll()
        # Only logs older than the one taking appends now: every entry in them was appended
        # before the checkpoint below seals the index, so the per-log lists it commits name all
        # their ledgers. A log rolled while that checkpoint syncs took entries the lists do not
        # name yet, and would pass for empty (an acknowledged ledger's entries were lost so).
        newest = logger.active_log
        try:
            await self.checkpoint()  # writes out buffered logs, so that they can be complete
            complete = await logger.complete_logs(older_than=newest)
            live = await log_usage(storage.index, complete)
            await self.checkpoint()  # the deletions durable: nothing held points into the rest
        except OSError as exc:
            result.skipped = f"checkpoint failed: {exc}"
            return result
        await self._remove(result, removable_logs(complete, {i for i in complete if live[i]}))
        threshold = self.config.gc_compaction_threshold
        if threshold > 0:
            try:
                await self._compact(result, [i for i in complete if live[i]], live, threshold)
            except OSError as exc:
                result.skipped = f"compaction failed: {exc}"
        return result

    async def _remove(self, result: GcResult, logs: list[int]) -> None:
        for log_id in logs:
            try:
                result.bytes_freed += await self.storage.entry_logger.remove_log(log_id)
            except OSError as exc:
                log.warning("cannot remove entry log %x: %s", log_id, exc)
                continue
            self.storage.index.drop_log(log_id)
            result.logs_removed.append(log_id)

    async def _compact(
        self, result: GcResult, shared: list[int], live: Counter[int], threshold: float
    ) -> None:
        """Copy the live entries out of the emptiest shared logs, then remove those logs (see
        ``bookie.compaction``). Counts of records come from the logs themselves."""
        storage = self.storage
        records = {log_id: await storage.entry_logger.record_count(log_id) for log_id in shared}
        chosen = compaction_candidates(live, records, threshold, COMPACT_LOGS_PER_PASS)
        if not chosen:
            return
        moved = await relocate(storage, chosen, self.config.entry_log_write_buffer)
        result.entries_moved += moved.moved
        await self.checkpoint()  # the copies, and the index naming them, durable together
        done = [i for i in chosen if not await references(storage.index, i)]
        result.logs_compacted.extend(done)
        await self._remove(result, done)
