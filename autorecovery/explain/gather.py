"""The I/O of an explanation: read what the store says about a ledger (its metadata, mark,
claim, the last worker's note, the registry, the auditor's status) and, given a connection
pool, ask its bookies about the copies ``probe_plan`` lists; then ``decide.explain``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiobk.autorecovery.checker import Holding, holds
from aiobk.autorecovery.explain.decide import explain
from aiobk.autorecovery.explain.model import Explanation, LedgerFacts, Probes
from aiobk.autorecovery.explain.probes import probe_plan
from aiobk.client.pool import BookiePool
from aiobk.metadata import LedgerMetadata, MetadataStore
from aiobk.protocol.errors import NoSuchLedgerError

PROBE_TIMEOUT = 5.0  # seconds for one bookie to answer one read
PROBES_AT_ONCE = 16  # reads in flight while asking about copies


async def _metadata(store: MetadataStore, ledger_id: int) -> LedgerMetadata | None:
    try:
        return await store.read_ledger(ledger_id)
    except NoSuchLedgerError:
        return None


async def gather_facts(
    store: MetadataStore,
    ledger_id: int,
    *,
    pool: BookiePool | None = None,
    wall_clock: Callable[[], float] = time.time,
    probe_timeout: float = PROBE_TIMEOUT,
) -> LedgerFacts:
    """Everything ``explain`` needs about ``ledger_id``. Without ``pool`` the bookies are not
    asked (the copies' states then come from the store alone)."""
    recovery = store.autorecovery
    metadata, mark, claimant, attempt, status = await asyncio.gather(
        _metadata(store, ledger_id),
        recovery.read_mark(ledger_id),
        recovery.claimant(ledger_id),
        recovery.read_attempt(ledger_id),
        recovery.read_status(),
    )
    enabled, auditor, infos, draining = await asyncio.gather(
        recovery.enabled(), recovery.auditor(), store.list_bookies(), recovery.decommissioning()
    )
    registered = frozenset(info.bookie_id for info in infos)
    probes: Probes | None = None
    if pool is not None and metadata is not None:
        probes = await ask_copies(pool, ledger_id, probe_plan(metadata, registered), probe_timeout)
    return LedgerFacts(
        ledger_id,
        int(wall_clock() * 1000),
        metadata,
        mark,
        claimant,
        attempt,
        enabled,
        auditor,
        status,
        registered,
        frozenset(info.bookie_id for info in infos if info.writable),
        frozenset(draining),
        probes,
        {info.bookie_id: info.rack for info in infos},
    )


async def ask_copies(
    pool: BookiePool, ledger_id: int, plan: list[tuple[str, int]], timeout: float
) -> dict[tuple[str, int], Holding]:
    """What each (bookie, entry) of ``plan`` answered, ``PROBES_AT_ONCE`` at a time; no
    answer within ``timeout`` is UNKNOWN."""
    room = asyncio.Semaphore(PROBES_AT_ONCE)

    async def one(bookie: str, entry: int) -> Holding:
        async with room:
            return await holds(pool, bookie, ledger_id, [entry], timeout, in_flight=1)

    answers = await asyncio.gather(*(one(bookie, entry) for bookie, entry in plan))
    return dict(zip(plan, answers, strict=True))


async def explain_ledger(
    store: MetadataStore,
    ledger_id: int,
    *,
    pool: BookiePool | None = None,
    wall_clock: Callable[[], float] = time.time,
    probe_timeout: float = PROBE_TIMEOUT,
) -> Explanation:
    """Why ``ledger_id`` is (or is not) under-replicated and what holds its repair now: the
    facts gathered, then decided on (``aiobk autorecovery explain``)."""
    facts = await gather_facts(
        store, ledger_id, pool=pool, wall_clock=wall_clock, probe_timeout=probe_timeout
    )
    return explain(facts)


__all__ = ["PROBE_TIMEOUT", "ask_copies", "explain_ledger", "gather_facts"]
