"""The offload profile: the run's log offloaded to the cluster's object store while it is
written, read and truncated, with the store failing and stalling and the offloaders crashing.

- The cluster's store is the simulated one (``SimObjectStore`` at ``objstore.URL``), its
  deletion lag 0-5 virtual seconds; the log gets an offload policy (``older_than`` a few
  seconds), so the elected auditor's offload pass (autorecovery in every bookie, its offload
  settings scaled to virtual time: ``autorecovery_config``) copies the log's older ledgers,
  releases them after the lag, takes back attempts that died and sweeps the store.
- A client calls ``offload_log`` now and then besides; a reader reads the whole log back now
  and then (``follow=False``), through ledgers the bookies released, into ``History``.
- The nemesis (``store_fault``) makes store calls fail, stalls them until healed (the
  callers' timeouts must fire), tears uploads, loses the store for a while, and crashes the
  auditor's bookie -- with its autorecovery -- during one of its store calls, mid-offload.

tests.sim.offload_check judges I18 and I19 at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from aiobk.autorecovery import AutoRecoveryConfig
from aiobk.client import BookKeeper, LogPosition
from aiobk.client.offload import OffloadReport
from aiobk.metadata import OffloadPolicy, OffloadStoreSettings
from aiobk.protocol.errors import BKError
from tests.sim.history import History, LogRead
from tests.sim.loss import autorecovery_config as loss_config
from tests.sim.objstore import URL
from tests.sim.workload import LOG
from tests.sim.world import SimBookie, World

if TYPE_CHECKING:
    from tests.sim.nemesis import Nemesis

STORE_FAULTS = ("store_fail", "store_stall", "store_tear", "store_lost", "crash_offloader")


def autorecovery_config(rng: random.Random) -> AutoRecoveryConfig:
    """The loss profiles' settings, with the offload pass's scaled to virtual seconds."""
    return dataclasses.replace(
        loss_config(rng),
        offload_interval=rng.choice((0.5, 1.5)),
        offload_stale_after=rng.choice((3.0, 8.0)),
        offload_sweep_interval=rng.choice((2.0, 6.0)),
        offload_concurrency=rng.choice((1, 2)),
    )


class Offloads:
    """The profile's clients (see the module docstring)."""

    def __init__(self, world: World, history: History, rng: random.Random) -> None:
        self.world = world
        self.history = history
        self.rng = rng
        self.deletion_lag = rng.choice((0.0, 0.0, 1.0, 5.0))
        self.older_than = rng.uniform(1.0, 4.0)

    def jobs(self, until: float) -> list[Coroutine[Any, Any, None]]:
        return [
            self._setup(),
            self._offloader("offloader-0", until),
            self._reader("logread-0", until),
        ]

    async def _setup(self) -> None:
        store = self.world.store()
        await store.set_offload_store(OffloadStoreSettings(URL, deletion_lag=self.deletion_lag))
        self.world.trace(
            f"offload: store {URL}, deletion lag {self.deletion_lag:g}s, policy older than "
            f"{self.older_than:.2f}s"
        )
        for _attempt in range(100):  # the log exists once its first writer opened it
            try:
                await store.set_offload_policy(LOG, OffloadPolicy(older_than=self.older_than))
                return
            except BKError:
                await asyncio.sleep(0.2)
        self.history.violations.append(f"I13 log {LOG}: its offload policy could not be set")

    async def _offloader(self, name: str, until: float) -> None:
        loop = asyncio.get_running_loop()
        bk = await self.world.client(name)
        while loop.time() < until:
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            report = await self._offload_once(name, bk)
            if report is None:
                continue
            done = [(item.ledger_id, item.outcome) for item in report.ledgers]
            copied = sum(outcome in ("copied", "released") for _, outcome in done)
            stats = self.history.offload
            stats["by clients"] = stats.get("by clients", 0) + copied
            self.world.trace(f"{name}: offloaded {done}")

    async def _offload_once(self, name: str, bk: BookKeeper) -> OffloadReport | None:
        try:
            return await bk.offload_log(LOG)
        except BKError as exc:  # as documented: the first failure, the other ledgers done
            self.world.trace(f"{name}: offload_log failed: {type(exc).__name__}: {exc}")
        return None

    async def _reader(self, name: str, until: float) -> None:
        loop = asyncio.get_running_loop()
        bk = await self.world.client(name)
        history = self.history
        while loop.time() < until + 3.0:
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
            records: list[tuple[tuple[int, int], bytes]] = []
            try:
                reader = await bk.open_log_reader(LOG, LogPosition.EARLIEST, follow=False)
                async for record in reader:
                    at = record.position
                    records.append(((at.ledger_id, at.entry_id), bytes(record.data)))
            except BKError as exc:
                self.world.trace(f"{name}: log read failed: {type(exc).__name__}: {exc}")
                continue
            history.log_reads.append(
                LogRead(name, records, max(history.log_truncations, default=-1))
            )


def _auditor(world: World, caller: str) -> SimBookie | None:
    """The bookie ``caller`` if its autorecovery is running the offload pass now."""
    sim = world.bookies.get(caller)
    if sim is None:
        return None
    companion = world.companion(sim)
    return sim if companion is not None and companion.offload_pass is not None else None


async def store_fault(n: Nemesis, kind: str) -> None:
    """One of ``STORE_FAULTS`` (see the module docstring), healed after a while."""
    world, rng = n.world, n.rng
    store = world.objects
    assert store is not None
    hold = rng.uniform(0.5, 4.0)
    n.injected[kind] = n.injected.get(kind, 0) + 1
    if kind == "store_fail":
        store.failure_rate = rng.choice((0.2, 0.5, 1.0))
        world.trace(f"objects: failing {store.failure_rate:g} of calls for {hold:.2f}s")

        async def mend() -> None:
            store.failure_rate = 0.0

        n.later(hold, mend)
    elif kind == "store_stall":
        store.stalls += rng.randint(1, 3)
        world.trace(f"objects: the next {store.stalls} call(s) stall for {hold:.2f}s")

        async def unstall() -> None:
            store.unstall()

        n.later(hold, unstall)
    elif kind == "store_tear":
        store.tears += rng.randint(1, 2)
        world.trace(f"objects: the next {store.tears} put(s) may be torn")
    elif kind == "store_lost":
        store.lost = True
        world.trace(f"objects: the store is unreachable for {hold:.2f}s")

        async def found() -> None:
            store.lost = False

        n.later(hold, found)
    elif kind == "crash_offloader":
        _arm_crash(n, hold)


def _arm_crash(n: Nemesis, hold: float) -> None:
    """Crash the auditor's bookie (and so its offload pass) at its next store call of a
    seeded kind: at a put's start or mid-upload, a read-back, a release's size check, or the
    sweep's and take-backs' listings and deletes."""
    world, rng = n.world, n.rng
    store = world.objects
    assert store is not None
    ops = rng.choice(
        (("put",), ("put part",), ("get", "head"), ("list", "list uploads", "delete", "abort"))
    )
    world.trace(f"objects: the auditor crashes at its next {'/'.join(ops)}")

    async def crash(sim: SimBookie) -> None:
        world.trace(f"{sim.node}: crashes mid-offload")
        await world.crash(sim, clean=False)
        await asyncio.sleep(hold)
        if not await world.start_bookie(sim):
            await asyncio.sleep(0.5)
            await world.start_bookie(sim)
        n.faulty.discard(sim.node)

    async def hook(caller: str, operation: str, _key: str) -> None:
        if operation not in ops:
            return
        sim = _auditor(world, caller)
        if sim is None or sim.node in n.faulty or len(n.faulty) >= n.max_faulty:
            return
        store.hook = None
        n.injected["offloader crashed"] = n.injected.get("offloader crashed", 0) + 1
        n.faulty.add(sim.node)
        task = asyncio.create_task(crash(sim))
        n.keep(task)
        await asyncio.wait({task})  # the crash cancels this call; asyncio.wait leaves it be

    store.hook = hook
