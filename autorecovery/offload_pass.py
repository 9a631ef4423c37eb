"""The offload pass: what the elected auditor does for tiered storage, so that one process in
the cluster does it (docs/design/tiered-storage.md).

Every ``offload_interval``: each log with an offload policy has the ledgers its policy makes
due offloaded (``offload_concurrency`` at a time); then one pass over the offload work list
releases copied ledgers whose deletion lag has passed and takes back attempts that died
(``offload_stale_after``); and every ``offload_sweep_interval`` the store is swept of objects
no metadata names. A failure of one step is logged and the next pass tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from aiobk.autorecovery.config import AutoRecoveryConfig
from aiobk.client.context import ClientContext
from aiobk.client.offload import offload_ledger, sweep, upkeep
from aiobk.client.offload.copy import OffloadSupersededError
from aiobk.client.offload.policy import due_ledgers
from aiobk.metadata import LedgerMetadata, OffloadStoreSettings
from aiobk.protocol.errors import BKError, NoSuchLedgerError, NoSuchLogError
from aiobk.tiered.open import StoreCache

log = logging.getLogger(__name__)


@dataclass(slots=True)
class OffloadPassReport:
    """What one pass did."""

    offloaded: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    abandoned: list[int] = field(default_factory=list)
    swept: int = 0  # objects and uploads no metadata named, removed
    errors: list[str] = field(default_factory=list)


class OffloadPass:
    """The pass, run by ``run`` while this process is the auditor."""

    def __init__(
        self,
        ctx: ClientContext,
        config: AutoRecoveryConfig,
        *,
        wall_clock: Callable[[], float],
        objects: StoreCache | None = None,
    ) -> None:
        self._ctx = ctx
        self._config = config
        self._now = wall_clock
        self.objects = objects or StoreCache()
        self._last_sweep: float | None = None

    async def run(self) -> None:
        """Passes every ``offload_interval`` until cancelled (never when it is 0)."""
        interval = self._config.offload_interval
        if interval <= 0:
            return
        try:
            while True:
                await self.once()
                await asyncio.sleep(interval)
        finally:
            await self.objects.close()

    async def once(self) -> OffloadPassReport:
        """One pass (see the module docstring)."""
        report = OffloadPassReport()
        store = self._ctx.store
        try:
            settings = await store.read_offload_store()
        except BKError as exc:
            report.errors.append(f"reading the offload store: {exc}")
            return report
        if settings is not None:
            await self._policies(settings, report)
        try:
            done = await upkeep(
                self._ctx, self.objects, settings, now=self._now,
                stale_after=self._config.offload_stale_after,
            )  # fmt: skip
            report.released, report.abandoned = done.released, done.abandoned
        except (BKError, ValueError) as exc:
            report.errors.append(f"the work list: {exc}")
        await self._sweep(settings, report)
        for error in report.errors:
            log.warning("offload pass: %s", error)
        return report

    async def _policies(self, settings: OffloadStoreSettings, report: OffloadPassReport) -> None:
        store = self._ctx.store
        now_ms = int(self._now() * 1000)
        gate = asyncio.Semaphore(self._config.offload_concurrency)

        async def one(ledger_id: int) -> None:
            async with gate:
                try:
                    result = await offload_ledger(
                        self._ctx, self.objects, settings, ledger_id, now=self._now,
                        stale_after=self._config.offload_stale_after,
                    )  # fmt: skip
                except (NoSuchLedgerError, OffloadSupersededError):
                    return
                except (BKError, ValueError) as exc:
                    report.errors.append(f"ledger {ledger_id}: {exc}")
                    return
                if result.outcome in ("copied", "released"):
                    report.offloaded.append(ledger_id)

        async for name in store.list_logs():
            try:
                record = await store.read_log(name)
                policy = record.offload_policy
                if policy is None:
                    continue
                metadata: dict[int, LedgerMetadata] = {}
                for ledger_id in record.ledgers:
                    try:
                        metadata[ledger_id] = await store.read_ledger(ledger_id)
                    except NoSuchLedgerError:
                        continue
                due = due_ledgers(record.ledgers, metadata, policy, now_ms)
            except NoSuchLogError:
                continue
            except BKError as exc:
                report.errors.append(f"log {name!r}: {exc}")
                continue
            if due:
                async with asyncio.TaskGroup() as group:
                    for ledger_id in due:
                        group.create_task(one(ledger_id))

    async def _sweep(
        self, settings: OffloadStoreSettings | None, report: OffloadPassReport
    ) -> None:
        interval = self._config.offload_sweep_interval
        now = self._now()
        if settings is None or interval <= 0:
            return
        if self._last_sweep is not None and now - self._last_sweep < interval:
            return
        self._last_sweep = now
        try:
            swept = await sweep(self._ctx, self.objects.get(settings.url))
        except (BKError, ValueError) as exc:
            report.errors.append(f"sweeping {settings.url}: {exc}")
            return
        report.swept = len(swept.objects) + len(swept.uploads)


__all__ = ["OffloadPass", "OffloadPassReport"]
