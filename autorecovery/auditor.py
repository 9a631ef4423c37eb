"""The auditor: one per cluster (elected through the store, ``service.AutoRecovery``), it finds
ledgers with copies missing and marks them for the workers (BookKeeper's Auditor).

- **Lost bookies.** Every ``tick`` it reads the registry. A bookie it knows of -- registered
  once, or named in some ledger's ensemble -- that is neither writable nor read-only starts a
  clock; once absent for ``lost_bookie_recovery_delay`` it is lost, and a bookie check walks
  every ledger's metadata (a page at a time) marking each ledger that names a lost bookie. The
  clock is this auditor's: a new auditor starts it afresh, so a failover never shortens the
  delay (the walk at election finds the bookies named in ledgers but never registered since).
  A bookie that returns before then costs nothing; one that returns later has its marks
  cleared by the workers, which ask it what it holds before copying anything.
- **Periodic check** (``auditor_periodic_check_interval``, or at once on ``aiobk autorecovery
  trigger-audit``): every ledger's closed fragments, every registered bookie in them, asked
  about the first and last entries it owes and a sampled share between (``checker``); a
  definite "not here" marks the ledger. Marks of deleted ledgers are dropped.
- **Placement** (``spread``): the bookie check's walk also marks a ledger (reason
  ``PLACEMENT``, naming no bookie) whose closed fragments have a write set spanning fewer racks
  than ``min_racks_per_write_quorum`` while a move to another rack's writable bookie would
  spread it; a change of the registered bookies' racks or writability runs that walk at once.
  A ledger too few racks can spread is not marked, so it is not marked again and again.
- **Status** for operators (lost and absent bookies, when the checks last ran) is published
  under the auditor's lease, with the count of marks as gauges.

Marking is idempotent (a mark is created or widened by compare-and-set), so two auditors for a
moment -- one whose lease lapsed unnoticed -- do no harm.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiobk.autorecovery.checker import Holding, check_ledger
from aiobk.autorecovery.config import AutoRecoveryConfig, published_settings
from aiobk.autorecovery.fragments import bookies_named
from aiobk.autorecovery.spread import cluster_spread, misplaced, rack_layout
from aiobk.autorecovery.stats import AutoRecoveryStats
from aiobk.client.context import ClientContext
from aiobk.metadata import (
    CHECK,
    LOST_BOOKIE,
    PLACEMENT,
    AuditorStatus,
    HeldLease,
    LedgerMetadata,
)
from aiobk.protocol.errors import NoSuchLedgerError
from aiobk.tasks import TaskKeeper

log = logging.getLogger(__name__)

STATUS_INTERVAL = 10.0  # seconds between recounts of the marks for the gauges and status


class Auditor:
    def __init__(
        self,
        ctx: ClientContext,
        config: AutoRecoveryConfig,
        auditor_id: str,
        *,
        stats: AutoRecoveryStats,
        wall_clock: Callable[[], float],
    ) -> None:
        self._ctx = ctx
        self._store = ctx.store
        self._marks = ctx.store.autorecovery
        self._config = config
        self.auditor_id = auditor_id
        self.stats = stats
        self._wall_clock = wall_clock
        self._known: set[str] = set()  # bookies registered once or named in a ledger
        self._absent: dict[str, float] = {}  # bookie -> loop time it was first seen absent
        self._absent_wall: dict[str, int] = {}  # ... and in wall milliseconds (for status)
        self.lost: set[str] = set()
        self._lost_wall: dict[str, int] = {}
        self._last_check = 0
        self._last_bookie_check = 0
        self._audit_seen = 0
        self._published: AuditorStatus | None = None
        self._layout: frozenset[tuple[str, str, bool]] | None = None  # racks as last checked
        self._seen_layout: frozenset[tuple[str, str, bool]] | None = None  # ... as last read

    @property
    def tick(self) -> float:
        return max(0.05, min(1.0, self._config.lost_bookie_recovery_delay / 4))

    def _now_ms(self) -> int:
        return int(self._wall_clock() * 1000)

    async def run(self, lease: HeldLease) -> None:
        """Audit until cancelled (the service cancels it when the lease is lost)."""
        loop = asyncio.get_running_loop()
        config = self._config
        self._audit_seen = await self._marks.audit_served()  # a request never served: now
        await self.bookie_check()  # at election: learn the bookies named in ledgers
        next_bookie_check = loop.time() + (config.auditor_periodic_bookie_check_interval or 1e18)
        check_every = config.auditor_periodic_check_interval
        next_check = loop.time() + (check_every or 1e18)
        next_status = loop.time()
        while True:
            newly_lost = await self._watch_registry()
            now = loop.time()
            relaid = self._layout is not None and self._layout != self._seen_layout
            if newly_lost or relaid or now >= next_bookie_check:
                await self.bookie_check()
                next_bookie_check = now + (config.auditor_periodic_bookie_check_interval or 1e18)
            requested = await self._marks.audit_requested()
            if requested > self._audit_seen or now >= next_check:
                asked = requested > self._audit_seen
                if asked:  # an operator asked: both checks, now
                    await self.bookie_check()
                await self.check_all()
                if asked:
                    await self._marks.serve_audit(requested)
                self._audit_seen = requested
                next_check = loop.time() + (check_every or 1e18)
            if newly_lost or loop.time() >= next_status:
                await self._publish(lease)
                next_status = loop.time() + STATUS_INTERVAL
            await asyncio.sleep(self.tick)

    async def _watch_registry(self) -> set[str]:
        """Update the absence clocks from the registry; the bookies that just became lost."""
        loop = asyncio.get_running_loop()
        infos = await self._store.list_bookies()
        self._seen_layout = rack_layout(infos)
        registered = {info.bookie_id for info in infos}
        writable = sum(info.writable for info in infos)
        self.stats.bookies_registered = len(infos)
        self.stats.bookies_writable = writable
        self.stats.bookies_readonly = len(infos) - writable
        self._known |= registered
        for bookie in registered:
            self._absent.pop(bookie, None)
            self._absent_wall.pop(bookie, None)
            if bookie in self.lost:
                log.info("auditor: bookie %s is back", bookie)
                self.lost.discard(bookie)
                self._lost_wall.pop(bookie, None)
        now, delay = loop.time(), self._config.lost_bookie_recovery_delay
        newly: set[str] = set()
        for bookie in self._known - registered:
            since = self._absent.setdefault(bookie, now)
            self._absent_wall.setdefault(bookie, self._now_ms())
            if bookie not in self.lost and now - since >= delay:
                newly.add(bookie)
        if newly:
            log.warning("auditor: bookies lost (absent %gs): %s", delay, ", ".join(sorted(newly)))
            self.lost |= newly
            for bookie in newly:
                self._lost_wall[bookie] = self._absent_wall.get(bookie, self._now_ms())
        self.stats.lost_bookies = len(self.lost)
        return newly

    async def bookie_check(self) -> None:
        """Walk every ledger's metadata: learn the bookies named, mark the ledgers that name a
        lost one, and those whose copies are not spread over racks as they could be."""
        now_ms = self._now_ms()
        named_everywhere: set[str] = set()
        infos = await self._store.list_bookies()
        layout = rack_layout(infos)
        spread = cluster_spread(infos, self._config.min_racks_per_write_quorum)
        draining = await self._marks.decommissioning()
        targets = {i.bookie_id for i in infos if i.writable and i.bookie_id not in draining}
        async for ledger_id, metadata in self._store.scan_ledgers():
            if metadata is None or metadata.is_offloaded:
                continue  # gone, or held by its object store copy: no bookie copy to keep
            named = bookies_named(metadata)
            named_everywhere |= named
            gone = named & self.lost
            if gone:
                await self._mark(ledger_id, gone, LOST_BOOKIE, now_ms)
            elif misplaced(metadata, spread, targets):
                await self._mark_placement(ledger_id, now_ms)
        self._layout = layout
        # Known: registered now, or named in some ledger (one named but never seen registered
        # by this auditor starts its clock now). A bookie that is neither -- decommissioned,
        # or lost with every copy moved -- is forgotten, and no longer reported lost.
        registered = {info.bookie_id for info in await self._store.list_bookies()}
        self._known = registered | named_everywhere
        for forgotten in set(self._absent) - self._known:
            del self._absent[forgotten]
            self._absent_wall.pop(forgotten, None)
        self.lost &= self._known
        for forgotten in set(self._lost_wall) - self.lost:
            del self._lost_wall[forgotten]
        self.stats.lost_bookies = len(self.lost)
        self._last_bookie_check = self._now_ms()

    async def check_all(self) -> None:
        """The periodic check over every ledger (see the module docstring); marks of deleted
        ledgers are dropped first."""
        ctx, config = self._ctx, self._config
        reported: set[int] = set()
        async for mark in self._marks.marks():
            try:
                await self._store.read_ledger(mark.ledger_id)
            except NoSuchLedgerError:
                await self._marks.unmark(mark)
                self.stats.marks_cleared += 1
                continue
            if mark.lost:
                reported.add(mark.ledger_id)  # reported lost: not checked again
        registered = {info.bookie_id for info in await self._store.list_bookies()}
        now_ms = self._now_ms()
        room = asyncio.Semaphore(config.auditor_check_concurrency)
        pending = TaskKeeper()  # cancelled as started

        async def check(ledger_id: int, metadata: LedgerMetadata) -> None:
            try:
                results = await check_ledger(
                    ctx.pool,
                    ledger_id,
                    metadata,
                    registered,
                    percentage=config.auditor_ledger_verification_percentage,
                    rng=ctx.rng,
                    timeout=ctx.config.read_timeout,
                )
                self.stats.ledgers_checked += 1
                missing = {r.bookie for r in results if r.holding is Holding.MISSING}
                if missing:
                    await self._mark(ledger_id, missing, CHECK, now_ms)
            finally:
                room.release()

        try:
            async for ledger_id, metadata in self._store.scan_ledgers():
                if metadata is None or ledger_id in reported or metadata.is_offloaded:
                    continue
                await room.acquire()  # at most `concurrency` ledgers checked at once
                pending.spawn(check(ledger_id, metadata))
            if pending:
                await asyncio.gather(*pending)
        finally:
            pending.cancel()
        self._last_check = self._now_ms()

    async def _mark(self, ledger_id: int, bookies: set[str], reason: str, now_ms: int) -> None:
        await self._marks.mark(ledger_id, bookies, reason, now_ms)
        self.stats.ledgers_marked += 1
        log.info("auditor: ledger %d under-replicated (%s: %s)", ledger_id, reason, sorted(bookies))

    async def _mark_placement(self, ledger_id: int, now_ms: int) -> None:
        """Mark the ledger for its placement, unless it is already (the walk runs often) or
        reported with entries lost (never retried)."""
        mark = await self._marks.read_mark(ledger_id)
        if mark is not None and (PLACEMENT in mark.reasons or mark.lost):
            return
        self.stats.ledgers_marked_for_placement += 1
        await self._mark(ledger_id, set(), PLACEMENT, now_ms)

    async def _publish(self, lease: HeldLease) -> None:
        under = lost = placement = 0
        async for mark in self._marks.marks():
            under += bool(mark.missing)
            lost += bool(mark.lost)
            placement += PLACEMENT in mark.reasons and not mark.missing and not mark.lost
        self.stats.under_replicated_ledgers = under
        self.stats.lost_ledgers = lost
        self.stats.misplaced_ledgers = placement
        status = AuditorStatus(
            self.auditor_id,
            dict(self._lost_wall),
            {b: t for b, t in self._absent_wall.items() if b not in self.lost},
            self._last_check,
            self._last_bookie_check,
            published_settings(self._config),
        )
        if self._published is None or status != self._published:
            self._published = await self._marks.publish_status(status, lease.id)


__all__ = ["Auditor"]
