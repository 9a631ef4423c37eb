"""Offloading a log: its closed ledgers before a position, a few at a time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from aiobk.client.context import ClientContext
from aiobk.client.log.position import LogPosition
from aiobk.client.offload.copy import LedgerOffload, OffloadSupersededError, offload_ledger
from aiobk.protocol.errors import BKError, NoOffloadStoreError, NoSuchLedgerError
from aiobk.tiered.open import StoreCache

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY: Final = 4  # ledgers copied at once: while one syncs its object, others copy


@dataclass(slots=True)
class OffloadReport:
    """What ``offload_log`` did, ledger by ledger, in log order."""

    log: str
    ledgers: list[LedgerOffload] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """The bytes of the objects written or found."""
        return sum(item.size for item in self.ledgers)


async def offload_log(
    ctx: ClientContext,
    objects: StoreCache,
    name: str,
    *,
    before: LogPosition | None,
    password: bytes | None,
    now: Callable[[], float],
    concurrency: int = DEFAULT_CONCURRENCY,
) -> OffloadReport:
    """Offload the closed ledgers of log ``name`` that lie wholly before ``before`` (every
    closed ledger when None). Ledgers deleted meanwhile (a truncation) are left out; one
    another offloader holds is reported ``busy``. A ledger that fails (the store, a bookie)
    does not stop the others: once all have run, the first failure is raised, and what the
    others did stays done."""
    settings = await ctx.store.read_offload_store()
    if settings is None:
        raise NoOffloadStoreError(
            "no offload store is set for this cluster: set one with `aiobk offload store URL`"
        )
    record = await ctx.store.read_log(name)
    ledgers = list(record.ledgers)
    if before is not None:
        if before.ledger_id not in ledgers:
            raise ValueError(f"log {name!r} has no ledger {before.ledger_id} (position {before})")
        ledgers = ledgers[: ledgers.index(before.ledger_id)]
    results: dict[int, LedgerOffload] = {}
    failures: list[BKError] = []
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(ledger_id: int) -> None:
        async with gate:
            try:
                results[ledger_id] = await offload_ledger(
                    ctx, objects, settings, ledger_id, now=now, password=password
                )
            except NoSuchLedgerError:
                return  # truncated away meanwhile
            except OffloadSupersededError:
                results[ledger_id] = LedgerOffload(ledger_id, "busy")
            except BKError as exc:  # the others go on; the first failure is raised after
                failures.append(exc)

    await asyncio.gather(*(one(ledger_id) for ledger_id in ledgers))
    if failures:
        if len(failures) > 1:
            log.warning("log %s: %d ledgers not offloaded: %s", name, len(failures), failures[1:])
        raise failures[0]
    return OffloadReport(name, [results[ledger] for ledger in ledgers if ledger in results])


__all__ = ["DEFAULT_CONCURRENCY", "OffloadReport", "offload_log"]
