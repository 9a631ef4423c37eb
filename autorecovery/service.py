"""Autorecovery in one process: a replication worker, and a candidate for auditor that audits
while it holds the election key. Every bookie runs one by default
(``autorecovery_enabled``); ``aiobk autorecovery start`` runs one on its own.

Election: a candidate creates the auditor key under a lease of its own; while the key exists
the others look again every ``autorecovery_poll_interval`` seconds. A lease that lapses (the
auditor died, or lost the store) frees the key and the next candidate to look takes over; the
old auditor, once it notices its lease is gone, stops auditing. For a moment two may audit:
harmless, as marking is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Callable

from aiobk.autorecovery.auditor import Auditor
from aiobk.autorecovery.config import AutoRecoveryConfig
from aiobk.autorecovery.offload_pass import OffloadPass
from aiobk.autorecovery.stats import AutoRecoveryStats
from aiobk.autorecovery.worker import ReplicationWorker, WorkerSwitches
from aiobk.client.config import ClientConfig
from aiobk.client.context import ClientContext
from aiobk.client.net import Connector
from aiobk.client.pool import BookiePool
from aiobk.metadata import HeldLease, MetadataStore
from aiobk.protocol.errors import BKError
from aiobk.tiered.open import StoreCache

log = logging.getLogger(__name__)


class AutoRecovery:
    def __init__(
        self,
        store: MetadataStore,
        config: AutoRecoveryConfig,
        node_id: str,
        *,
        client_config: ClientConfig | None = None,
        connector: Connector | None = None,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float],
        secret_bytes: Callable[[int], bytes],
        switches: WorkerSwitches = WorkerSwitches(),  # noqa: B008 (frozen)
        run_worker: bool = True,
        run_auditor: bool = True,
        objects: Callable[[], StoreCache] | None = None,
    ) -> None:
        """``node_id`` names this process in the election and in claims (a bookie's id, or a
        host-and-pid for a standalone one). ``connector``, ``rng``, ``wall_clock`` and
        ``secret_bytes`` are the seams the simulator replaces, and ``objects`` (a new cache of
        object stores for each term as auditor)."""
        self._store = store
        self.config = config
        self.node_id = node_id
        # Replacements spread over as many racks as autorecovery's own setting asks.
        self._client_config = dataclasses.replace(
            client_config or ClientConfig(),
            min_racks_per_write_quorum=config.min_racks_per_write_quorum,
        )
        self._connector = connector
        self._rng = rng or random.Random()
        self._wall_clock = wall_clock
        self._secret_bytes = secret_bytes
        self._switches = switches
        self._poll = config.autorecovery_poll_interval
        self._run_worker = run_worker
        self._run_auditor = run_auditor
        self.stats = AutoRecoveryStats()
        self.auditor: Auditor | None = None  # while this process audits
        self.offload_pass: OffloadPass | None = None  # ... and runs the offload pass
        # The object stores the offload pass writes to (the simulator's, in the simulator).
        self._objects = objects or StoreCache
        self.worker: ReplicationWorker | None = None
        self._pool: BookiePool | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        pool = self._pool = BookiePool(self._store, self._client_config, self._connector)
        ctx = ClientContext.build(self._store, pool, self._client_config, self._rng)
        loop = asyncio.get_running_loop()
        if self._run_worker:
            self.worker = ReplicationWorker(
                ctx,
                self.config,
                self.node_id,
                stats=self.stats,
                wall_clock=self._wall_clock,
                secret_bytes=self._secret_bytes,
                switches=self._switches,
                poll_interval=self._poll,
            )
            self._tasks.append(loop.create_task(self.worker.run(), name="autorecovery-worker"))
        if self._run_auditor:
            self._tasks.append(loop.create_task(self._elect(ctx), name="autorecovery-election"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, BKError):
                await task
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _elect(self, ctx: ClientContext) -> None:
        marks = self._store.autorecovery
        while True:
            lease: HeldLease | None = None
            try:
                lease = await HeldLease.grant(
                    self._store.kv, self.config.autorecovery_lease_ttl, f"auditor {self.node_id}"
                )
                while not await marks.elect(self.node_id, lease.id):
                    await asyncio.sleep(self._poll * (0.5 + self._rng.random()))
                    if lease.lost.is_set():
                        break
                else:
                    await self._audit(ctx, lease)
            except Exception as exc:  # the store down, or a bug: log it and stand again
                log.warning("autorecovery %s: election: %r", self.node_id, exc)
                await asyncio.sleep(self._poll)
            finally:
                if lease is not None:
                    with contextlib.suppress(BKError):
                        await lease.close()

    async def _audit(self, ctx: ClientContext, lease: HeldLease) -> None:
        """Audit while the lease holds; return once it is lost (or the audit fails)."""
        self.stats.auditor_elections += 1
        log.info("autorecovery %s: elected auditor", self.node_id)
        auditor = self.auditor = Auditor(
            ctx, self.config, self.node_id, stats=self.stats, wall_clock=self._wall_clock
        )
        loop = asyncio.get_running_loop()
        audit = loop.create_task(auditor.run(lease), name="auditor")
        lost = loop.create_task(lease.lost.wait(), name="auditor-lease")
        offloads = self.offload_pass = OffloadPass(
            ctx, self.config, wall_clock=self._wall_clock, objects=self._objects()
        )
        offloading = loop.create_task(offloads.run(), name="auditor-offload")
        try:
            await asyncio.wait({audit, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.auditor = self.offload_pass = None
            for task in (audit, lost, offloading):
                task.cancel()
            outcome, _lost, offloaded = await asyncio.gather(
                audit, lost, offloading, return_exceptions=True
            )
            if isinstance(offloaded, Exception):
                log.warning("autorecovery %s: offload pass stopped: %r", self.node_id, offloaded)
            if isinstance(outcome, Exception):
                log.warning("autorecovery %s: auditor stopped: %r", self.node_id, outcome)
            # The gauges are the auditor's counts: a process that no longer audits shows none
            # (its last ones stayed exported, and a sum over processes counted them twice).
            stats = self.stats
            stats.under_replicated_ledgers = stats.lost_ledgers = stats.lost_bookies = 0
            stats.misplaced_ledgers = 0
        log.info("autorecovery %s: no longer the auditor", self.node_id)


__all__ = ["AutoRecovery"]
