"""The faults of invariant I15, copies restored (docs/design/invariants.md): bookies lost for
good while autorecovery runs in every bookie and the writers keep going. A seeded plan, beside
the nemesis's usual faults:

1. A bookie is wiped and never returns; the plan waits until autorecovery has repaired every
   ledger that named it (no ledger names a lost bookie, no mark still lists missing bookies).
2. Meanwhile, maybe: a bookie down briefly while the copies are made -- it must come back
   without its copies moved needlessly (counted), or moved consistently; the auditor's lease
   lapsing mid-audit (a second auditor takes over while the first has not noticed); a busy
   worker's lease lapsing mid-copy (a second worker takes the same ledger: only the
   compare-and-set on the ledger's version may decide).
3. Maybe: a bookie down past ``lost_bookie_recovery_delay`` (declared lost), returning while
   its ledgers are being copied.
4. A second bookie lost after the first repair -- either plainly, or as the race of
   ``worker_race``: a worker holding a stale view of a ledger (its swap held at the store, its
   claim's lease lapsed) while a second worker repairs the same ledger for both lost bookies.
   With the version fence the stale swap fails; without it, it writes the second lost bookie
   back into the ledger, and I15 catches it.

The racks profile's plan (``LossPlan.rack``) instead: once ledgers are written on every rack,
one whole rack lost for good at one instant, with the side faults of step 2 and maybe a bookie
declared lost and returning after the repair (tests.sim.racks).

Each wait is bounded. Every other fault lasts seconds, so a repair not done ``REPAIR_WAIT``
after a loss is one autorecovery does not make by itself: an I15 violation, reported then (the
checker's own recoveries at the end would otherwise close what the workers left stuck).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiobk.autorecovery import AutoRecoveryConfig
from aiobk.client import BookKeeper
from aiobk.metadata import MetadataStore
from aiobk.protocol.errors import BKError
from tests.sim.history import Append
from tests.sim.world import SimBookie, World

if TYPE_CHECKING:
    from tests.sim.nemesis import Nemesis

REPAIR_WAIT = 60.0  # virtual seconds the plan waits for one repair before it goes on
POLL = 0.25


@dataclass(frozen=True)
class LossPlan:
    brief_bounce: float  # chance of a bookie down briefly during the first repair
    long_bounce: float  # chance of one declared lost, then returning mid-copy
    auditor_lapse: float  # chance, per repair, of the auditor's lease lapsing mid-audit
    worker_lapse: float  # chance, per repair, of a busy worker's lease lapsing mid-copy
    race: float  # chance that the second loss comes as the worker race
    # The racks profile instead (tests.sim.racks): one whole rack lost at once, nothing after.
    rack: bool = False


PLANS: dict[str, LossPlan] = {
    "loss": LossPlan(brief_bounce=0.4, long_bounce=0.4, auditor_lapse=0.5, worker_lapse=0.5,
                     race=0.3),
    "worker_race": LossPlan(brief_bounce=0.0, long_bounce=0.0, auditor_lapse=0.0,
                            worker_lapse=0.0, race=1.0),
    "racks": LossPlan(brief_bounce=0.4, long_bounce=0.3, auditor_lapse=0.5, worker_lapse=0.5,
                      race=0.0, rack=True),
}  # fmt: skip


def autorecovery_config(rng: random.Random) -> AutoRecoveryConfig:
    """Fast, seeded settings. Every owed entry is checked (percentage 100): I15 asks for
    every copy, and only a full check finds one missing in a fragment's middle. The
    lost-bookie delay is past the nemesis's longest outage (1.5 s), so only the plan's
    bookies are ever declared lost."""
    return AutoRecoveryConfig(
        lost_bookie_recovery_delay=rng.choice((2.5, 4.0)),
        auditor_periodic_check_interval=rng.choice((5.0, 15.0)),
        auditor_ledger_verification_percentage=100.0,
        auditor_check_concurrency=rng.choice((2, 16)),
        open_ledger_rereplication_grace_period=rng.choice((1.0, 4.0)),
        rereplication_max_bytes_per_second=rng.choice((0, 20_000)),
        rereplication_entries_in_flight=rng.choice((1, 8, 64)),
        rereplication_retry_delay=0.3,
        autorecovery_lease_ttl=rng.choice((1.5, 3.0)),
        autorecovery_poll_interval=rng.choice((0.2, 0.5)),
    )


async def unrepaired(
    store: MetadataStore, lost: set[str], *, skip: int | None = None
) -> tuple[list[int], list[int]]:
    """The ledgers that still name a lost bookie, and those still marked with bookies
    missing (``skip`` left out of both)."""
    naming = [
        ledger_id
        async for ledger_id, metadata in store.scan_ledgers()
        if metadata is not None and ledger_id != skip and metadata.bookies() & lost
    ]
    marked = [
        mark.ledger_id
        async for mark in store.autorecovery.marks()
        if mark.missing and mark.ledger_id != skip
    ]
    return naming, marked


class Loss:
    """The plan of one run (see the module docstring)."""

    def __init__(self, nemesis: Nemesis, plan: LossPlan, rng: random.Random) -> None:
        self.nemesis = nemesis
        self.world: World = nemesis.world
        self.workload = nemesis.workload
        self.plan = plan
        self.rng = rng
        self.store = self.world.store()
        config = self.world.autorecovery
        assert config is not None
        self.config = config
        self._side: list[asyncio.Task[None]] = []

    def trace(self, text: str) -> None:
        self.world.trace(f"loss: {text}")

    def _count(self, kind: str) -> None:
        self.nemesis._count(kind)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            for task in self._side:
                task.cancel()
            await asyncio.gather(*self._side, return_exceptions=True)
            self.world.release_holds()
            assert self.workload.finish is not None
            self.workload.finish.set()

    async def _run(self) -> None:
        rng, plan = self.rng, self.plan
        if plan.rack:
            await self._lose_rack()
            return
        race = rng.random() < plan.race
        brief = rng.random() < plan.brief_bounce
        long = rng.random() < plan.long_bounce
        if race:  # two losses, the second while one ledger is left to a stale worker
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            if long:
                await self._bounce(brief=False)
                await self.settled()
            if await self._race():
                await self.settled()
                return
            long = False  # no race this time (no ledger to race on): the plain plan
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        if not await self._lose():
            return
        await self._after_loss(brief, long)
        await self._lose()
        self._meanwhile()
        await self.settled()

    async def _lose_rack(self) -> None:
        """The racks profile: once ledgers are written on every rack (some closed), a whole
        rack lost for good at one instant; meanwhile maybe a bookie down briefly, and after the
        repair maybe one declared lost and returning while its ledgers are copied."""
        rng, world = self.rng, self.world
        brief = rng.random() < self.plan.brief_bounce
        long = rng.random() < self.plan.long_bounce
        await asyncio.sleep(rng.uniform(3.0, 10.0))
        by_rack: dict[str, list[SimBookie]] = {}
        for sim in world.bookies.values():
            by_rack.setdefault(sim.config.rack, []).append(sim)
        rack = rng.choice(sorted(by_rack))
        sims = by_rack[rack]
        self._count("lose_rack")
        self.workload.history.unsynced_loss = True
        self.trace(f"rack {rack} lost whole: {[sim.node for sim in sims]}")
        await world.lose_together(sims)
        await self._after_loss(brief, long)

    async def _after_loss(self, brief: bool, long: bool) -> None:
        """What follows a loss: the faults meanwhile, maybe a bookie down briefly while the
        repair runs, then maybe one declared lost and returning while its ledgers are copied."""
        self._meanwhile()
        bounce = asyncio.create_task(self._bounce(brief=True)) if brief else None
        await self.settled()
        if bounce is not None:
            await bounce
        if long:
            await self._bounce(brief=False)
            await self.settled()

    def _pick(self) -> SimBookie | None:
        nemesis = self.nemesis
        choices = [s for s in self.world.bookies.values() if s.up and s.node not in nemesis.faulty]
        return self.rng.choice(choices) if choices else None

    async def _lose(self, sim: SimBookie | None = None) -> bool:
        sim = sim or self._pick()
        if sim is None:
            return False
        self._count("lose")
        self.workload.history.unsynced_loss = True
        await self.world.lose(sim)
        return True

    async def settled(self, *, skip: int | None = None, limit: float = REPAIR_WAIT) -> bool:
        """Until autorecovery has repaired every ledger that names a lost bookie (``skip``
        aside). Every fault but the losses lasts a few seconds at most, so a repair that takes
        over ``limit`` seconds is one autorecovery will not make by itself: an I15 violation
        (the checker's own recoveries at the end could hide it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        lost = self.world.lost
        while True:
            naming, marked = await unrepaired(self.store, lost, skip=skip)
            if not naming and not marked:
                return True
            if loop.time() >= deadline:
                self.trace(f"not repaired after {limit:g}s: naming {naming}, marked {marked}")
                self.workload.history.violations.append(
                    f"I15 not repaired {limit:g}s after losing {sorted(lost)}: ledgers "
                    f"{naming} name a lost bookie, ledgers {marked} are still marked"
                )
                return False
            await asyncio.sleep(POLL)

    async def _until(self, what: str, done: Callable[[], Awaitable[bool]]) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPAIR_WAIT
        while not await done():
            if loop.time() >= deadline:
                self.trace(f"gave up waiting for {what}")
                return False
            await asyncio.sleep(POLL / 5)
        return True

    # ------------------------------------------------------------------ side faults

    def _meanwhile(self) -> None:
        """The lapses that may hit a repair in progress."""
        if self.rng.random() < self.plan.auditor_lapse:
            self._side.append(asyncio.create_task(self._auditor_lapse()))
        if self.rng.random() < self.plan.worker_lapse:
            self._side.append(asyncio.create_task(self._worker_lapse()))

    async def _auditor_lapse(self) -> None:
        """The auditor's lease lapses while it checks every ledger: a second auditor is
        elected while the first still runs, until its next refresh finds the lease gone."""
        world = self.world
        await asyncio.sleep(self.rng.uniform(0.5, 6.0))
        kv, keys = world.kv, self.store.keys
        found, _rev = await kv.get(keys.auditor)
        companions = [world.companion(sim) for sim in world.bookies.values()]
        auditing = [c for c in companions if c is not None and c.auditor is not None]
        if found is None or not found.lease or not auditing:
            return
        stats = auditing[0].stats
        checked = stats.ledgers_checked
        await self.store.autorecovery.request_audit()  # a full check, at once
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while stats.ledgers_checked == checked and loop.time() < deadline:
            await asyncio.sleep(0.005)
        again, _rev = await kv.get(keys.auditor)
        if again is None or again.lease != found.lease:
            return
        self._count("auditor_lapse")
        self.trace(
            f"auditor {again.value.decode()}'s lease lapses mid-audit "
            f"({stats.ledgers_checked - checked} ledgers checked)"
        )
        await kv.revoke_lease(found.lease)

    async def _worker_lapse(self) -> None:
        """A worker's lease lapses while it repairs a ledger: its claim goes, another worker
        may take the ledger while the first still copies."""
        await asyncio.sleep(self.rng.uniform(0.0, 3.0))
        kv, prefix = self.world.kv, self.store.keys.claims_prefix
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15.0
        while loop.time() < deadline:
            claims, _rev = await kv.range(prefix)
            if claims:
                await asyncio.sleep(self.rng.uniform(0.0, 0.2))
                claim = self.rng.choice(claims)
                found, _rev = await kv.get(claim.key)
                if found is None or not found.lease:
                    continue
                self._count("worker_lapse")
                self.trace(
                    f"worker {found.value.decode()}'s lease lapses mid-repair of "
                    f"{claim.key[len(prefix) :].decode()}"
                )
                await kv.revoke_lease(found.lease)
                return
            await asyncio.sleep(0.05)

    async def _bounce(self, *, brief: bool) -> None:
        """A bookie down (its disk intact) briefly, or long enough to be declared lost; it
        returns while the copies are being made."""
        world, nemesis, rng = self.world, self.nemesis, self.rng
        await asyncio.sleep(rng.uniform(0.0, 2.0) if brief else 0.0)
        sim = self._pick()
        if sim is None:
            return
        config = self.config
        if brief:
            down = rng.uniform(0.2, 0.5 * config.lost_bookie_recovery_delay)
        else:
            ttl = sim.config.registration_ttl
            down = ttl + config.lost_bookie_recovery_delay + rng.uniform(1.0, 4.0)
        clean = rng.random() < 0.5
        nemesis.faulty.add(sim.node)
        self._count("brief_bounce" if brief else "long_bounce")
        try:
            if not clean:
                self.workload.history.unsynced_loss = True
            await world.crash(sim, clean=clean)
            self.trace(f"{sim.node} down {down:.2f}s")
            await asyncio.sleep(down)
            for _attempt in range(3):
                if await world.start_bookie(sim):
                    break
                await asyncio.sleep(0.5)
            if not brief:
                marked = [
                    mark.ledger_id
                    async for mark in self.store.autorecovery.marks()
                    if sim.bookie_id in mark.missing
                ]
                self.trace(f"{sim.node} back; ledgers still marked for it: {marked}")
        finally:
            nemesis.faulty.discard(sim.node)

    # ------------------------------------------------------------------ the race

    async def _racing_ledger(self) -> tuple[int, list[str]] | None:
        """A closed E3 WQ3 AQ3 ledger of the plan's own (every entry on all three bookies),
        recorded in the history like a writer's."""
        history = self.workload.history
        bk: BookKeeper = await self.world.client("racer")
        try:
            lh = await bk.create_ledger(3, 3, 3)
        except BKError as exc:
            self.trace(f"racer: create_ledger failed: {type(exc).__name__}")
            return None
        ledger_id = lh.ledger_id
        history.ledgers[ledger_id] = (3, 3, 3)
        loop = asyncio.get_running_loop()
        try:
            for index in range(self.rng.randint(10, 60)):
                op = Append(ledger_id, f"{self.world.seed}:{ledger_id}:race{index}".encode(),
                            loop.time())  # fmt: skip
                history.appends.append(op)
                try:
                    op.entry_id = await lh.append(op.value)
                    op.result = "ok"
                except BKError as exc:
                    op.result = "unknown"
                    op.error = f"{type(exc).__name__}: {exc}"
                    raise
            await lh.close()
        except BKError as exc:
            self.trace(f"racer: ledger {ledger_id} not written: {type(exc).__name__}")
            return None
        nodes = [b.rsplit(":", 1)[0] for b in lh.metadata.ensemble]
        self.trace(f"racer: ledger {ledger_id} closed on {nodes}")
        return ledger_id, nodes

    async def _race(self) -> bool:
        """Two workers on one ledger, one with a stale view (module docstring, step 4); two
        bookies lost. False, nothing lost, when there is no ledger to race on."""
        world, rng, store = self.world, self.rng, self.store
        made = await self._racing_ledger()
        by_node = world.bookies
        if made is None or not all(by_node[n].up for n in made[1]):
            return False
        ledger_id, nodes = made
        self._count("worker_race")
        hold = world.hold("compare_and_set", store.keys.ledger(ledger_id))
        second: SimBookie | None = None
        try:
            first = by_node[rng.choice(nodes)]
            await self._lose(first)
            if not await self._until("a worker's swap", _is_set(hold.reached)):
                return True
            owner = await store.autorecovery.claimant(ledger_id)
            self.trace(f"worker {owner}'s swap in ledger {ledger_id} held at the store")
            await self.settled(skip=ledger_id)  # every other ledger repaired first
            others = [
                n
                for n in nodes
                if n != first.node and by_node[n].up and by_node[n].bookie_id != owner
            ]
            if not others:
                return True
            second = by_node[rng.choice(others)]
            await self._lose(second)

            async def widened() -> bool:
                mark = await store.autorecovery.read_mark(ledger_id)
                return mark is not None and second.bookie_id in mark.missing

            if not await self._until(f"ledger {ledger_id}'s mark to name {second.node}", widened):
                return True
            claim, _rev = await world.kv.get(store.keys.claim(ledger_id))
            if claim is not None and claim.lease:
                self.trace(f"worker {claim.value.decode()}'s lease lapses, its swap still held")
                await world.kv.revoke_lease(claim.lease)
            lost = {first.bookie_id, second.bookie_id}

            async def repaired() -> bool:
                with contextlib.suppress(BKError):
                    metadata = await store.read_ledger(ledger_id)
                    return not metadata.bookies() & lost
                return False

            if await self._until(f"a second worker to repair ledger {ledger_id}", repaired):
                self.trace(f"ledger {ledger_id} repaired by another worker; the held swap goes on")
        finally:
            hold.release()
            if second is None:  # the race did not get that far: a plain second loss
                await self.settled()
                await self._lose()
        await asyncio.sleep(1.0)
        return True


def _is_set(event: asyncio.Event) -> Callable[[], Awaitable[bool]]:
    async def done() -> bool:
        return event.is_set()

    return done
