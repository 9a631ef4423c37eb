"""Garbage collection: reclaim the disk of deleted ledgers (BookKeeper's GarbageCollectorThread
with its scan-and-compare collector, and compaction).

``delete_ledger`` only removes a ledger's metadata; each bookie notices later. One pass:

1. Walk the ids of the ledgers this bookie holds (from the index, ascending) beside the
   metadata store's listing (ascending, page by page). A ledger's metadata exists before any
   bookie is sent its entries, so a ledger held here but missing from the listing was deleted
   (ids are never reused); neither side is held whole in memory.
2. Read each candidate's metadata once more and keep it unless the store says it does not
   exist. Ledgers in limbo wait while the boot repair (BP-46 phase two) runs. Any metadata
   error ends the pass having deleted nothing. Likewise the ledgers held here that the
   offload work list names, kept unless their metadata says their object store copy is
   released (docs/design/tiered-storage.md): their readers read the object from then on.
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

While a pass runs, ``progress`` says how far it is; ``report`` says, per entry log, what the
next passes will do with it and why they keep what they keep (``bookie.gc_report``).

``GcSchedule`` decides when passes run for a bookie: every ``gc_interval`` while it serves
(each followed by a compaction of the metadata store's history), forced by the disk monitor,
or asked for by an operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiobk.bookie.compaction import compaction_candidates, log_usage, references, relocate
from aiobk.bookie.config import BookieConfig, ConfigError
from aiobk.bookie.entrylog.format import CorruptEntryError
from aiobk.bookie.errors import BookieStateError
from aiobk.bookie.gc_report import (
    ACTIVE,
    GcProgress,
    LedgerFacts,
    LogFacts,
    classify,
    report_document,
)
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.bookie.write_state import DISK, WriteState
from aiobk.metadata import MetadataStore, OffloadState
from aiobk.protocol.errors import BKError, NoSuchLedgerError

log = logging.getLogger(__name__)

COMPACT_LOGS_PER_PASS = 8  # bounds the copying one pass does
CONFIRM_AT_ONCE = 32  # metadata reads in flight while confirming deletions
MEASURE_PER_PASS = 2  # logs of an earlier life whose bytes per ledger a pass measures (a read)
REPORT_LOOKUPS = 32  # ledgers keeping logs whose metadata a report reads, at most
REPORT_LOOKUP_TIMEOUT = 5.0  # seconds for those reads together


@dataclass
class GcResult:
    """What one pass did."""

    ledgers_deleted: list[int] = field(default_factory=list)
    ledgers_released: list[int] = field(default_factory=list)  # offloaded: the object holds them
    logs_removed: list[int] = field(default_factory=list)  # compacted ones included
    logs_compacted: list[int] = field(default_factory=list)
    entries_moved: int = 0
    bytes_freed: int = 0
    skipped: str = ""  # why the pass stopped early, if it did

    def figures(self) -> dict[str, Any]:
        """What it did in counts, not ids (a pass may drop thousands): the last pass of the
        GC report, and HTTP ``gc``'s answer."""
        return {
            "ledgers_deleted": len(self.ledgers_deleted),
            "ledgers_released": len(self.ledgers_released),
            "logs_removed": len(self.logs_removed),
            "logs_compacted": len(self.logs_compacted),
            "entries_moved": self.entries_moved,
            "bytes_freed": self.bytes_freed,
            "skipped": self.skipped or None,
        }


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


async def listed(held: Iterator[int], listing: AsyncIterator[int]) -> list[int]:
    """Ledgers held here that an ascending listing names (the offload work list): a merge
    walk of the two ascending streams, as ``unlisted`` walks them."""
    found: list[int] = []
    mine = next(held, None)
    async for name in listing:
        while mine is not None and mine < name:
            mine = next(held, None)
        if mine is None:
            break
        if mine == name:
            found.append(mine)
            mine = next(held, None)
    return found


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

    return await _confirm(candidates, deleted)


async def confirm_released(store: MetadataStore, candidates: list[int]) -> list[int]:
    """The candidates whose metadata says their object store copy is released: the bookies
    drop them (their readers read the object). A ledger deleted meanwhile is left to the
    deletion walk."""

    async def released(ledger_id: int) -> bool:
        try:
            metadata = await store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            return False
        offload = metadata.offload
        return offload is not None and offload.state is OffloadState.RELEASED

    return await _confirm(candidates, released)


async def _confirm(candidates: list[int], check: Callable[[int], Awaitable[bool]]) -> list[int]:
    doomed: list[int] = []
    for start in range(0, len(candidates), CONFIRM_AT_ONCE):
        chunk = candidates[start : start + CONFIRM_AT_ONCE]
        found = await asyncio.gather(*(check(i) for i in chunk), return_exceptions=True)
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
        self.wall_clock: Callable[[], float] = time.time
        self.progress: GcProgress | None = None  # the pass running now
        self.last_pass: dict[str, Any] | None = None  # what the last pass did, and when
        self.stuck: set[int] = set()  # logs compaction could not empty (a damaged record)

    async def collect(
        self, store: MetadataStore, owner: str, *, short_of_space: bool, keep_limbo: bool
    ) -> GcResult:
        """One pass. ``keep_limbo``: the boot repair still works on limbo ledgers."""
        async with self._lock:
            progress = self.progress = GcProgress(self.wall_clock())
            try:
                result = await self._collect(store, short_of_space, keep_limbo)
            finally:
                self.progress = None
        finished = self.wall_clock()
        self.last_pass = {"started": progress.started, "finished": finished, **result.figures()}
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
            offloaded = await listed(storage.ledger_ids(), store.list_offloading())
            released = await confirm_released(store, offloaded)
        except BKError as exc:  # MetadataStoreError and the like: delete nothing this time
            result.skipped = f"metadata store: {exc}"
            return result
        progress = self.progress
        for ledger_id in doomed:
            if storage.delete_ledger(ledger_id):
                result.ledgers_deleted.append(ledger_id)
        for ledger_id in released:
            if storage.delete_ledger(ledger_id):
                result.ledgers_released.append(ledger_id)
        if progress is not None:
            progress.ledgers_deleted = len(result.ledgers_deleted)
            progress.phase = "removing entry logs with nothing live"
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
        await self._measure([i for i in complete if live[i] and i not in result.logs_removed])
        return result

    async def _measure(self, logs: list[int]) -> None:
        """Learn the bytes per ledger of a few logs that do not know them (written before
        they were tallied, or by a life that crashed): what the report's live bytes need."""
        logger = self.storage.entry_logger
        left = MEASURE_PER_PASS
        for log_id in logs:
            if left == 0:
                return
            try:
                if await logger.ledger_bytes(log_id) is None:
                    left -= 1
                    await logger.ledger_bytes(log_id, scan=True)
            except (OSError, ValueError) as exc:  # gone meanwhile, or unreadable
                log.warning("cannot measure entry log %x: %s", log_id, exc)

    async def _remove(self, result: GcResult, logs: list[int]) -> None:
        for log_id in logs:
            try:
                result.bytes_freed += await self.storage.entry_logger.remove_log(log_id)
            except OSError as exc:
                log.warning("cannot remove entry log %x: %s", log_id, exc)
                continue
            self.storage.index.cache.drop_log(log_id)
            self.stuck.discard(log_id)
            result.logs_removed.append(log_id)
            if self.progress is not None:
                self.progress.logs_removed = len(result.logs_removed)

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
        progress = self.progress
        if progress is not None:
            progress.phase, progress.logs_to_compact = "compacting", len(chosen)
        moved = await relocate(storage, chosen, self.config.entry_log_write_buffer, progress)
        result.entries_moved += moved.moved
        await self.checkpoint()  # the copies, and the index naming them, durable together
        done = [i for i in chosen if not await references(storage.index, i)]
        self.stuck |= set(chosen) - set(done)
        result.logs_compacted.extend(done)
        if progress is not None:
            progress.logs_compacted, progress.compacting = len(done), None
        await self._remove(result, done)

    # ------------------------------------------------------------------ the report

    async def report(self, store: MetadataStore | None) -> dict[str, Any]:
        """Each entry log's live and total bytes and its verdict (``bookie.gc_report``), the
        pass running now and the last one. The ledgers keeping logs are looked up in ``store``
        (a few, briefly): open, closed or deleted."""
        logs, ledgers = await self._log_facts()
        threshold = self.config.gc_compaction_threshold
        stuck = frozenset(self.stuck)

        def verdicts() -> list[Any]:
            return classify(
                logs, ledgers, threshold=threshold, per_pass=COMPACT_LOGS_PER_PASS, stuck=stuck
            )

        reports = verdicts()
        if store is not None:
            keeping = sorted({k[0] for r in reports for k in r.kept_by})[:REPORT_LOOKUPS]
            found = await _metadata_states(store, keeping)
            for ledger_id, state in found.items():
                ledgers[ledger_id] = LedgerFacts(
                    ledgers[ledger_id].held, ledgers[ledger_id].limbo, state
                )
            reports = verdicts()
        progress = self.progress
        return report_document(
            reports,
            threshold=threshold,
            progress=progress.to_document() if progress is not None else None,
            last_pass=self.last_pass,
        )

    async def _log_facts(self) -> tuple[list[LogFacts], dict[int, LedgerFacts]]:
        storage = self.storage
        logger, index = storage.entry_logger, storage.index
        active = logger.active_log
        pending = index.pending_log_counts()
        logs: list[LogFacts] = []
        ledgers: dict[int, LedgerFacts] = {}
        for log_id in await logger.log_ids():
            try:
                size = await logger.log_size(log_id)
                records = await logger.known_record_count(log_id)
                sizes = await logger.known_ledger_bytes(log_id)
            except (OSError, CorruptEntryError):
                continue  # removed meanwhile (by a pass running now)
            entries = dict(index.log_ledgers(log_id))
            for ledger_id, count in pending.get(log_id, {}).items():
                entries[ledger_id] = entries.get(ledger_id, 0) + count
            for ledger_id in entries:
                if ledger_id not in ledgers:
                    limbo = storage.limbo_of(ledger_id)
                    ledgers[ledger_id] = LedgerFacts(limbo is not None, bool(limbo))
            state = ACTIVE if log_id == active else ""
            logs.append(LogFacts(log_id, size, state, records, entries, sizes))
            await asyncio.sleep(0)
        return logs, ledgers


class GcSchedule:
    """A bookie's passes: on its interval while it serves, forced, or asked for."""

    def __init__(
        self,
        collector: GarbageCollector,
        config: BookieConfig,
        metadata: Callable[[], MetadataStore | None],
        owner: Callable[[], str],
        running: Callable[[], bool],
        write_state: WriteState,
        repairing: Callable[[], bool],
    ) -> None:
        """``metadata``: the bookie's store (None: it has none, or not yet); ``owner``: its
        id; ``running``: whether it serves; ``repairing``: whether its boot-time repair
        (BP-46 phase two) still runs, which keeps ledgers in limbo."""
        self.collector = collector
        self.config = config
        self._metadata = metadata
        self._owner = owner
        self._running = running
        self._write_state = write_state
        self._repairing = repairing

    async def run(self) -> None:
        """A pass every ``gc_interval`` seconds until cancelled (or the bookie stops)."""
        while True:
            await asyncio.sleep(self.config.gc_interval)
            if not self._running():
                return  # stopping: the stop cancels this task, maybe a moment after this wakes
            try:
                result = await self.collect()
            except BookieStateError:
                return  # the stop began during the pass
            except Exception:  # a disk error, a metadata outage, ...: the next pass tries again
                log.exception("garbage collection failed; trying again next time")
                continue
            if result.skipped:
                log.warning("bookie %s: gc pass skipped: %s", self._owner(), result.skipped)
            await self._compact_metadata_history()

    async def _compact_metadata_history(self) -> None:
        """Bound etcd's history (``MetadataStore.compact_history``), after each GC pass."""
        keep = self.config.metadata_history_revisions
        store = self._metadata()
        if keep <= 0 or store is None:
            return
        try:
            await store.compact_history(keep)
        except BKError as exc:
            log.warning("bookie %s: cannot compact the metadata history: %s", self._owner(), exc)

    async def forced(self) -> GcResult | None:
        """The disk monitor's forced pass (needs the metadata store, as every pass)."""
        if self._metadata() is None or not self._running():
            return None
        return await self.collect(forced=True)

    async def collect(self, forced: bool = False) -> GcResult:
        """One pass; ``forced``: the disk is over its warning threshold.

        Raises:
            ConfigError: The bookie has no metadata store.
            BookieStateError: It is not running.
        """
        store = self._metadata()
        if store is None:
            raise ConfigError("garbage collection needs a metadata store")
        if not self._running():
            raise BookieStateError("the bookie is not running")
        short = forced or self._write_state.is_set(DISK)
        return await self.collector.collect(
            store, self._owner(), short_of_space=short, keep_limbo=self._repairing()
        )

    async def report(self) -> dict[str, Any]:
        """Why each entry log's space is kept, and the pass running now (``bookie.gc_report``)."""
        return await self.collector.report(self._metadata())


async def _metadata_states(store: MetadataStore, ledger_ids: list[int]) -> dict[int, str]:
    """ "open", "closed" or "deleted" for each ledger the store answers about in time."""
    found: dict[int, str] = {}

    async def one(ledger_id: int) -> None:
        try:
            metadata = await store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            found[ledger_id] = "deleted"
        except BKError:
            return
        else:
            found[ledger_id] = "closed" if metadata.is_closed else "open"

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(REPORT_LOOKUP_TIMEOUT):
            await asyncio.gather(*(one(i) for i in ledger_ids))
    return found
