"""Does a bookie still hold what a ledger's fragments say it holds? (BookKeeper's LedgerChecker.)

For each closed fragment and each of its bookies that is registered, ask about a few of the
entries that bookie owes (``fragments.check_points``: the first, the last, a sampled share) with
plain reads. Only a definite answer counts as missing -- no such entry, no such ledger, or a
damaged copy (EIO: it is not a copy any more). A timeout, an unreachable bookie or a bookie in
limbo (BP-46, still repairing itself) says nothing either way (apache/bookkeeper#1197: counting
transient errors as missing filled the marks with ledgers nobody could repair). Bookies not
registered are the lost-bookie check's business, which waits ``lost_bookie_recovery_delay``
before it calls them lost.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from aiobk.autorecovery.fragments import FragmentRange, check_points, closed_fragments
from aiobk.client.entry_read import ask
from aiobk.client.pool import BookiePool
from aiobk.metadata import LedgerMetadata
from aiobk.protocol import StatusCode
from aiobk.protocol.errors import BKError

ABSENT = (StatusCode.ENOENTRY, StatusCode.ENOLEDGER, StatusCode.EIO)


class Holding(enum.Enum):
    HELD = "held"
    MISSING = "missing"  # a definite answer: the copy is not there (or damaged)
    UNKNOWN = "unknown"  # no definite answer (unreachable, timed out, in limbo)


@dataclass(frozen=True, slots=True)
class SlotCheck:
    fragment: FragmentRange
    slot: int
    bookie: str
    holding: Holding


ASKED_AT_ONCE = 16  # reads in flight per (bookie, ledger) a check asks


async def _ask_one(
    pool: BookiePool, bookie: str, ledger_id: int, entry_id: int, timeout: float
) -> Holding:
    try:
        response = await ask(pool, bookie, ledger_id, entry_id, timeout)
    except BKError:
        return Holding.UNKNOWN
    if response.status is StatusCode.EOK and response.body is not None:
        return Holding.HELD
    return Holding.MISSING if response.status in ABSENT else Holding.UNKNOWN


async def holds(
    pool: BookiePool,
    bookie: str,
    ledger_id: int,
    entries: Iterable[int],
    timeout: float,
    in_flight: int = ASKED_AT_ONCE,
) -> Holding:
    """Whether ``bookie`` answers for every one of ``entries``: asked ``in_flight`` at a time
    (a check at 100% of a big ledger would otherwise put tens of thousands of reads on one
    connection and stall the bookie it comes from), stopping at the first one missing."""
    pending = iter(entries)
    found: set[Holding] = set()

    async def asker() -> None:
        for entry_id in pending:
            if Holding.MISSING in found:
                return
            found.add(await _ask_one(pool, bookie, ledger_id, entry_id, timeout))

    await asyncio.gather(*(asker() for _ in range(in_flight)))
    if Holding.MISSING in found:
        return Holding.MISSING
    return Holding.UNKNOWN if Holding.UNKNOWN in found else Holding.HELD


async def absent_entries(
    pool: BookiePool,
    bookie: str,
    ledger_id: int,
    entries: Iterable[int],
    timeout: float,
    in_flight: int,
) -> tuple[list[int], bool]:
    """Which of ``entries`` ``bookie`` definitely lacks (ascending), asking ``in_flight`` at
    a time; and whether some answers were not definite."""
    pending = iter(entries)
    absent: list[int] = []
    unsure = False

    async def asker() -> None:
        nonlocal unsure
        for entry_id in pending:
            holding = await _ask_one(pool, bookie, ledger_id, entry_id, timeout)
            if holding is Holding.MISSING:
                absent.append(entry_id)
            elif holding is Holding.UNKNOWN:
                unsure = True

    await asyncio.gather(*(asker() for _ in range(in_flight)))
    return sorted(absent), unsure


async def check_ledger(
    pool: BookiePool,
    ledger_id: int,
    metadata: LedgerMetadata,
    registered: Collection[str],
    *,
    percentage: float,
    rng: random.Random,
    timeout: float,
) -> list[SlotCheck]:
    """Every (closed fragment, slot) whose bookie is registered, with what its bookie holds."""
    checks: list[tuple[FragmentRange, int, str, list[int]]] = []
    for fragment in closed_fragments(metadata):
        for slot, bookie in enumerate(fragment.ensemble):
            if bookie in registered:
                points = check_points(fragment, slot, metadata, percentage, rng)
                checks.append((fragment, slot, bookie, points))
    answers = await asyncio.gather(
        *(holds(pool, bookie, ledger_id, points, timeout) for _f, _s, bookie, points in checks)
    )
    return [
        SlotCheck(fragment, slot, bookie, holding)
        for (fragment, slot, bookie, _points), holding in zip(checks, answers, strict=True)
    ]


__all__ = ["Holding", "SlotCheck", "absent_entries", "check_ledger", "holds"]
