"""The seeded fault scheduler. Faults come from a weighted menu (a *profile*) at seeded moments
for a fixed stretch of virtual time. A budget keeps every run recoverable: at most
``max_faulty`` bookies are faulty at once, and at most one data-losing fault (a wiped disk, or
an unclean crash of a journal-less bookie) happens per run -- more could legitimately destroy
an acknowledged entry's every copy, which no protocol survives.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from tests.sim.offload import STORE_FAULTS, store_fault
from tests.sim.scenarios import SCENARIOS
from tests.sim.workload import Workload
from tests.sim.world import SimBookie, World

PROFILES: dict[str, dict[str, float]] = {
    # Everything, in the proportions a long campaign wants.
    "mixed": {
        "crash": 3, "stop": 1, "pause": 2, "partition": 2, "partition_one_way": 2,
        "reset_request": 2, "reset_reply": 2, "wipe": 0.5, "recover": 2, "read_errors": 1,
        "full_disk": 0.5, "slow": 1, "unfenced_read": 1, "change_race": 1,
        "stale_writer": 0.5,
        "slow_metadata": 1,
    },
    # Racing recovery against live writers: fencing and ensemble-change faults.
    "race": {
        "recover": 3, "pause": 2, "partition_one_way": 3, "reset_reply": 1, "slow": 2,
        "unfenced_read": 4, "change_race": 4, "slow_metadata": 2,
    },
    # One scenario at a time (tests.sim.scenarios), for the tooth tests.
    "unfenced_read": {"unfenced_read": 1},
    "stale_writer": {"stale_writer": 1},
    "change_race": {"change_race": 1},
    "lost_entry": {"lost_entry": 1},
    # Unclean crashes and restarts (journal-less runs lose data this way).
    "crashes": {"crash": 6, "recover": 3, "pause": 1, "lost_entry": 2},
    # tests.sim.loss: bookies lost for good, one then another, while autorecovery
    # runs in the bookies; besides the plan, faults that lose no data.
    "loss": {
        "crash": 2, "stop": 1, "pause": 2, "partition": 1, "partition_one_way": 1,
        "reset_request": 1, "reset_reply": 1, "recover": 1, "read_errors": 1, "slow": 1,
        "slow_metadata": 1, "change_race": 0.5,
    },
    # tests.sim.racks: a whole rack lost for good; besides, the loss profile's faults.
    "racks": {
        "crash": 2, "stop": 1, "pause": 2, "partition": 1, "partition_one_way": 1,
        "reset_request": 1, "reset_reply": 1, "recover": 1, "read_errors": 1, "slow": 1,
        "slow_metadata": 1, "change_race": 0.5,
    },
    # Two workers racing on one ledger, one with a stale view (the plan's race, nothing else).
    "worker_race": {"pause": 1},
    # Producers (tests.sim.producers) dying mid-append and re-sending, while bookies fail
    # under their writers and faults cut the producers off.
    "producers": {
        "crash": 2, "stop": 1, "pause": 2, "partition": 2, "partition_one_way": 2,
        "reset_request": 2, "reset_reply": 2, "recover": 1, "slow": 1, "slow_metadata": 1,
    },
    # tests.sim.offload: the run's log offloaded while bookies fail under it, the object store
    # fails, stalls, tears uploads and goes away, and the auditor crashes mid-offload.
    "offload": {
        "crash": 2, "stop": 1, "pause": 1, "partition": 1, "partition_one_way": 1,
        "reset_request": 1, "reset_reply": 1, "recover": 0.5, "slow": 1, "slow_metadata": 1,
        "store_fail": 2, "store_stall": 2, "store_tear": 1.5, "store_lost": 1,
        "crash_offloader": 2.5,
    },
}  # fmt: skip


class Nemesis:
    def __init__(
        self,
        world: World,
        rng: random.Random,
        workload: Workload,
        profile: str,
        max_faulty: int,
    ) -> None:
        self.world = world
        self.rng = rng
        self.workload = workload
        self._menu = PROFILES[profile]
        self.max_faulty = max_faulty
        self.faulty: set[str] = set()
        self.data_loss_used = False
        self.injected: dict[str, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._clients = 0

    def trace(self, text: str) -> None:
        self.world.trace(text)

    async def run(self, duration: float, faults: int) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + duration
        for _ in range(faults):
            await asyncio.sleep(self.rng.uniform(0, 2 * duration / max(faults, 1)))
            if loop.time() >= end or self.workload.finished():
                break
            kind = self.rng.choices(list(self._menu), weights=list(self._menu.values()))[0]
            await self._inject(kind)
        await asyncio.gather(*self._tasks)

    def _pick(self) -> SimBookie | None:
        if len(self.faulty) >= self.max_faulty:
            return None
        choices = [s for s in self.world.bookies.values() if s.up and s.node not in self.faulty]
        return self.rng.choice(choices) if choices else None

    def later(self, delay: float, heal: Callable[[], Awaitable[None]]) -> None:
        """Run ``heal`` after ``delay`` seconds (a fault that holds no bookie)."""
        self._later(delay, heal, "")

    def keep(self, task: asyncio.Task[None]) -> None:
        """A task of a fault's, awaited before the nemesis is done."""
        self._tasks.append(task)

    def _later(self, delay: float, heal: Callable[[], Awaitable[None]], node: str) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            await heal()
            self.faulty.discard(node)

        self._tasks.append(asyncio.create_task(run()))

    async def _inject(self, kind: str) -> None:
        world, rng = self.world, self.rng
        if kind == "recover":
            self._clients += 1
            self._count(kind)
            self._tasks.append(
                asyncio.create_task(self.workload.recover_one(f"recoverer-{self._clients}"))
            )
            return
        if kind in STORE_FAULTS:
            await store_fault(self, kind)
            return
        if kind in SCENARIOS:
            await self._scenario(kind)
            return
        if kind == "slow_metadata":
            world.metadata_delay = 0.5
            self.trace("metadata: slow phase")
            self._count(kind)

            async def quick() -> None:
                world.metadata_delay = 0.003

            self._later(rng.uniform(0.5, 2.0), quick, "")
            return
        if kind == "slow":
            world.net.slow = 0.2
            self.trace("net: slow phase")
            self._count(kind)

            async def fast() -> None:
                world.net.slow = 0.0

            self._later(rng.uniform(0.2, 1.0), fast, "")
            return
        losing = kind == "wipe" or (kind in ("crash", "full_disk") and world.journal_less)
        if losing and self.data_loss_used:
            kind = {"wipe": "pause", "crash": "stop", "full_disk": "read_errors"}[kind]
            losing = False
        sim = self._pick()
        if sim is None:
            return
        node = sim.node
        self.faulty.add(node)
        self._count(kind)
        if kind in ("crash", "wipe", "full_disk"):
            self.workload.history.unsynced_loss = True
        hold = rng.uniform(0.1, 1.5)
        if kind in ("crash", "stop", "wipe"):
            if kind == "wipe":
                await world.wipe(sim)
            else:
                await world.crash(sim, clean=kind == "stop")
            if losing:
                self.data_loss_used = True

            async def restart() -> None:
                if not await world.start_bookie(sim):
                    await asyncio.sleep(0.5)
                    await world.start_bookie(sim)

            self._later(hold, restart, node)
        elif kind == "pause":
            self.trace(f"{node}: paused {hold:.2f}s")
            world.net.pause(node)

            async def resume() -> None:
                world.net.resume(node)
                self.trace(f"{node}: resumed")

            self._later(hold, resume, node)
        elif kind in ("partition", "partition_one_way"):
            peers = [f"writer-{i}" for i in range(2)] + self.workload.peers
            peers += [n for n in world.bookies if n != node]
            peer = rng.choice(peers)
            links = [(peer, node)] if rng.random() < 0.5 else [(node, peer)]
            if kind == "partition":
                links = [(peer, node), (node, peer)]
            for source, target in links:
                world.net.partition(source, target)
            self.trace(f"net: cut {links} for {hold:.2f}s")

            async def heal() -> None:
                for source, target in links:
                    world.net.heal_link(source, target)
                self.trace(f"net: healed {links}")

            self._later(hold, heal, node)
        elif kind in ("reset_request", "reset_reply"):
            recoverer = f"recoverer-{self._clients + 1}"
            clients = ["writer-0", "writer-1", "reader-0", recoverer, *self.workload.peers]
            client = rng.choice(clients)
            pair = (client, node) if kind == "reset_request" else (node, client)
            world.net.reset_next(*pair)
            self.trace(f"net: next write {pair[0]}->{pair[1]} resets its connection")
            self.faulty.discard(node)
        elif kind == "read_errors":
            sim.disk.read_errors = 0.3
            self.trace(f"{node}: disk read errors for {hold:.2f}s")

            async def clear() -> None:
                sim.disk.read_errors = 0.0

            self._later(hold, clear, node)
        elif kind == "full_disk":
            sim.disk.full = True
            self.trace(f"{node}: disk full for {hold:.2f}s, then restarted")

            async def free() -> None:
                sim.disk.full = False
                await world.crash(sim, clean=False)  # a failed journal needs a restart
                await world.start_bookie(sim)

            self.data_loss_used = self.data_loss_used or losing  # an unclean restart
            self._later(hold, free, node)

    async def _scenario(self, kind: str) -> None:
        """A pattern from tests.sim.scenarios against a live writer's ledger."""
        live = sorted(self.workload.handles.items())
        if not live or len(self.faulty) >= self.max_faulty:
            return
        writer, handle = self.rng.choice(live)
        nodes = [_node(b) for b in handle.metadata.ensemble]
        if len(nodes) < 3 or any(n in self.faulty or not self.world.bookies[n].up for n in nodes):
            return
        self.faulty.update(nodes)
        self._count(kind)

        async def run() -> None:
            try:
                await SCENARIOS[kind](self, writer, handle, nodes)
            finally:
                self.faulty.difference_update(nodes)

        self._tasks.append(asyncio.create_task(run()))

    def new_recoverer(self) -> str:
        self._clients += 1
        return f"recoverer-{self._clients}"

    def cut(self, links: list[tuple[str, str]], hold: float) -> None:
        """Partition each (source, target) link for ``hold`` seconds."""
        for source, target in links:
            self.world.net.partition(source, target)

        async def heal() -> None:
            await asyncio.sleep(hold)
            for source, target in links:
                self.world.net.heal_link(source, target)
            self.trace(f"net: healed {links}")

        self._tasks.append(asyncio.create_task(heal()))

    def _count(self, kind: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1


def _node(bookie_id: str) -> str:
    return bookie_id.rsplit(":", 1)[0]
