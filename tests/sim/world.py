"""One simulated cluster: bookies (the real ``bookie.Bookie``), clients (the real
``client.BookKeeper``) and a memory metadata store, all on one virtual-time loop, wired through
the simulated network and disks. Every source of randomness comes from the run's seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from aiobk.autorecovery import AutoRecovery, AutoRecoveryConfig, AutoRecoveryStats, WorkerSwitches
from aiobk.bookie import Bookie, BookieConfig
from aiobk.bookie.repair import Repairer
from aiobk.client import BookKeeper, ClientConfig
from aiobk.client.config import ProtocolSwitches
from aiobk.client.offload import is_released
from aiobk.client.repair import BookieRepairer
from aiobk.metadata import DEFAULT_RACK, MetadataStore
from aiobk.metadata.kv import KV, KeyValue, Watch
from aiobk.metadata.kv_memory import MemoryKV
from aiobk.tiered.open import StoreCache
from tests.sim.disk import SimDisk
from tests.sim.network import SimNetwork
from tests.sim.objstore import SimObjectStore

PORT = 3181

_RUNS = itertools.count()


def _rack(index: int, bookies: int, racks: int) -> str:
    """Bookie ``index`` (from 1)'s rack: ``racks`` racks of consecutive bookies, in one zone;
    none, every bookie in the default rack, where placement draws as a cluster without racks
    does (the other profiles' seeds replay as before)."""
    if not racks:
        return DEFAULT_RACK
    return f"/zone-a/rack-{(index - 1) * racks // bookies + 1}"


@dataclass(frozen=True)
class Switches:
    """The protection each tooth test switches off (docs/design/invariants.md)."""

    recovery_reads_fence: bool = True
    boot_fence: bool = True
    boot_limbo: bool = True
    hold_acks_during_change: bool = True
    replace_after_cas: bool = True
    # A replication worker's swap is a compare-and-set on the version it read.
    metadata_version_fence: bool = True
    # A producer's writer appends each sequence once (client ``ProtocolSwitches``).
    deduplicate_producers: bool = True
    # Placement spreads every write set over racks (the racks profile: a whole rack lost).
    spread_over_racks: bool = True

    def client(self) -> ProtocolSwitches:
        return ProtocolSwitches(
            recovery_reads_fence=self.recovery_reads_fence,
            hold_acks_during_change=self.hold_acks_during_change,
            replace_after_cas=self.replace_after_cas,
            deduplicate_producers=self.deduplicate_producers,
            spread_over_racks=self.spread_over_racks,
        )


class NodeKV(KV):
    """The metadata store as one client node reaches it. Once the node is dead (``World.kill``)
    it reaches nothing: a call it makes never returns, as none would from a killed process,
    and no write of it lands."""

    def __init__(self, kv: KV, net: SimNetwork, node: str) -> None:
        self._kv = kv
        self._net = net
        self._node = node

    async def _reach(self) -> None:
        if self._node in self._net.dead:
            await self._net.hang()

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        await self._reach()
        return await self._kv.get(key)

    async def create(self, key: bytes, value: bytes, lease: int = 0) -> int:
        await self._reach()
        return await self._kv.create(key, value, lease)

    async def compare_and_set(self, key: bytes, value: bytes, expected: int, lease: int = 0) -> int:
        await self._reach()
        return await self._kv.compare_and_set(key, value, expected, lease)

    async def delete(self, key: bytes, expected: int | None = None) -> None:
        await self._reach()
        await self._kv.delete(key, expected)

    async def bump(self, key: bytes) -> int:
        await self._reach()
        return await self._kv.bump(key)

    async def range(
        self,
        prefix: bytes,
        after: bytes | None = None,
        limit: int = 1000,
        *,
        keys_only: bool = False,
        end: bytes | None = None,
    ) -> tuple[list[KeyValue], int]:
        await self._reach()
        return await self._kv.range(prefix, after, limit, keys_only=keys_only, end=end)

    async def watch(self, key: bytes, *, prefix: bool, start_revision: int) -> Watch:
        await self._reach()
        return await self._kv.watch(key, prefix=prefix, start_revision=start_revision)

    async def compact(self, revision: int) -> None:
        await self._reach()
        await self._kv.compact(revision)

    async def grant_lease(self, ttl: float) -> tuple[int, float]:
        await self._reach()
        return await self._kv.grant_lease(ttl)

    async def keep_alive(self, lease: int) -> float:
        await self._reach()
        return await self._kv.keep_alive(lease)

    async def revoke_lease(self, lease: int) -> None:
        await self._reach()
        await self._kv.revoke_lease(lease)

    async def lease_time_to_live(self, lease: int) -> tuple[float, float] | None:
        await self._reach()
        return await self._kv.lease_time_to_live(lease)

    async def close(self) -> None:
        await self._kv.close()


@dataclass
class Hold:
    """One metadata write held at the store (``World.hold``)."""

    op: str
    key: bytes
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self.released.set()


@dataclass
class SimBookie:
    node: str
    config: BookieConfig
    disk: SimDisk
    bookie: Bookie | None = None
    lost_data: bool = False  # wiped, or crashed while running without the journal
    incarnation: int = 0
    fenced_acked: set[int] = field(default_factory=set)  # fences it acknowledged
    lost_forever: bool = False  # wiped and never to return (the loss profiles)
    down_since: float | None = None  # when its current outage began
    longest_outage: float = 0.0  # the longest outage it came back from

    @property
    def bookie_id(self) -> str:
        return f"{self.node}:{PORT}"

    @property
    def up(self) -> bool:
        return self.bookie is not None


class World:
    def __init__(
        self,
        seed: int,
        rng: random.Random,
        *,
        bookies: int,
        journal_less: bool,
        switches: Switches,
        trace: Callable[[str], None],
        autorecovery: AutoRecoveryConfig | None = None,
        racks: int = 0,
        offload: bool = False,
    ) -> None:
        self.seed = seed
        self.rng = rng
        self.switches = switches
        self.trace = trace
        self.net = SimNetwork(rng, trace)
        self.kv_name = f"sim-{seed}-{next(_RUNS)}"
        self.kv = MemoryKV.shared(self.kv_name)
        self.kv.hook = self._metadata_latency
        self.metadata_delay = 0.003  # upper bound of one metadata write's latency
        self.journal_less = journal_less
        self.bookies: dict[str, SimBookie] = {}
        self.clients: list[BookKeeper] = []
        self.violations: list[str] = []
        self.gc_ledgers = 0  # deleted ledgers dropped by bookies' garbage collection
        self.gc_logs = 0  # entry logs it removed
        self.gc_moved = 0  # live entries its compaction copied
        self.states_loaded = 0  # ledger states read back from the index
        # Autorecovery beside every bookie (the loss profiles), with these settings.
        self.autorecovery = autorecovery
        self.repairs = AutoRecoveryStats()  # what every bookie life's autorecovery did
        self._holds: list[Hold] = []
        self.restored: dict[str, int] = {}  # what the I15 check found (tests.sim.checker)
        self._by_name: dict[str, BookKeeper] = {}
        self.racked = racks > 0  # bookies in racks (the racks profile)
        for index in range(1, bookies + 1):
            node = f"10.0.0.{index}"
            config = BookieConfig(
                rack=_rack(index, bookies, racks),
                data_dir=f"/sim/{node}",
                host=node,
                port=PORT,
                registration_ttl=3.0,
                flush_interval=rng.choice((0.05, 0.3, 2.0)),
                journal_write_data=not journal_less,
                journal_max_file_size=rng.choice((8192, 65536, 1 << 20)),
                journal_alignment=rng.choice((0, 512)),
                entry_log_max_size=rng.choice((4096, 16384, 1 << 20)),
                entry_log_write_buffer=rng.choice((1024, 65536)),
                repair_retry_interval=0.3,
                gc_interval=rng.choice((0.5, 2.0)),
                gc_compaction_threshold=rng.choice((0.0, 0.5, 0.9)),
                # Ledger states dropped after every checkpoint and loaded again from
                # the index, and checkpoints started early by a write cache that fills at once.
                ledger_state_cache_size=rng.choice((1, 4, 10_000)),
                write_cache_max_size=rng.choice((400, 64 << 20)),
                boot_fence=switches.boot_fence,
                boot_limbo=switches.boot_limbo,
            )
            slow_syncs = rng.choice((0.0, 0.05))
            self.bookies[node] = SimBookie(
                node, config, SimDisk(rng, node, slow_storage_syncs=slow_syncs)
            )
        # The cluster's object store (the offload profile), drawn only then, so that the other
        # profiles' seeds replay as before.
        self.objects: SimObjectStore | None = None
        if offload:
            self.objects = SimObjectStore(random.Random(rng.getrandbits(64)), trace)

    def store_cache(self, node: str) -> StoreCache:
        """The object stores node ``node`` opens (a client's ``objects``, an auditor's): the
        simulated store, reached from that node."""
        assert self.objects is not None
        return StoreCache(self.objects.opener(node))

    async def _metadata_latency(self, op: str, key: bytes) -> None:
        await asyncio.sleep(self.rng.uniform(1e-4, self.metadata_delay))
        for hold in self._holds:
            if (hold.op, hold.key) == (op, key):
                self._holds.remove(hold)
                hold.reached.set()
                await hold.released.wait()  # the write is checked and applied after this
                break

    def hold(self, op: str, key: bytes) -> Hold:
        """Hold the next metadata write ``op`` on ``key`` until ``release()``: whoever makes it
        waits with what it read before (a stale view), as a process paused mid-request does."""
        hold = Hold(op, key)
        self._holds.append(hold)
        return hold

    def release_holds(self) -> None:
        for hold in self._holds:
            hold.release()
        self._holds.clear()

    def store(self) -> MetadataStore:
        return MetadataStore(self.kv, "aiobk", f"memory://{self.kv_name}")

    def client_config(self, *, switches: bool = True) -> ClientConfig:
        return ClientConfig(
            add_timeout=1.0,
            read_timeout=1.0,
            speculative_read_timeout=0.2,
            connect_timeout=0.5,
            metadata_timeout=2.0,
            long_poll_timeout=0.5,
            reconnect_backoff_min=0.05,
            reconnect_backoff_max=0.5,
            bookie_list_ttl=0.5,
            switches=self.switches.client() if switches else ProtocolSwitches(),
        )

    async def client(self, name: str, *, switches: bool = True, mortal: bool = False) -> BookKeeper:
        """The client running on node ``name`` (one per node, made on first use). A
        ``mortal`` one reaches the metadata through ``NodeKV``, so that ``kill`` can end it."""
        known = self._by_name.get(name)
        if known is not None:
            return known
        store = self.store()
        if mortal:
            store = MetadataStore(
                NodeKV(self.kv, self.net, name), "aiobk", f"memory://{self.kv_name}"
            )
        bk = self._by_name[name] = await BookKeeper.connect(
            store,
            self.client_config(switches=switches),
            rng=random.Random(self.rng.getrandbits(64)),
            connector=self.net.connector(name),
            wall_clock=asyncio.get_running_loop().time,
        )
        if self.objects is not None:
            bk.objects = self.store_cache(name)
        self.clients.append(bk)
        return bk

    def kill(self, name: str) -> None:
        """The client node ``name`` dies as a SIGKILLed process does: its connections drop with
        whatever was still on the wire, and nothing it does reaches a bookie or the metadata
        store again (a ``mortal`` client's). Its code may go on running, to no effect."""
        self.net.dead.add(name)
        self.net.crash(name)
        self.trace(f"{name}: killed")

    # ------------------------------------------------------------------ bookies

    def _repairer(self, node: str) -> Callable[[MetadataStore, str], Repairer]:
        def make(store: MetadataStore, bookie_id: str) -> Repairer:
            return BookieRepairer(
                store,
                bookie_id,
                self.client_config(),
                connector=self.net.connector(node),
                rng=random.Random(self.rng.getrandbits(64)),
            )

        return make

    def _autorecovery(self, node: str) -> Callable[[str, MetadataStore], AutoRecovery]:
        """Autorecovery in one bookie life: its worker and a candidate for auditor,
        on the simulated network, the virtual clock and seeded randomness. Drawn only when
        autorecovery is on, so the other profiles' seeds replay as before."""
        config = self.autorecovery
        assert config is not None
        fence = self.switches.metadata_version_fence

        def make(bookie_id: str, store: MetadataStore) -> AutoRecovery:
            secrets = random.Random(self.rng.getrandbits(64))
            return AutoRecovery(
                store,
                config,
                bookie_id,
                client_config=self.client_config(),
                connector=self.net.connector(node),
                rng=random.Random(self.rng.getrandbits(64)),
                wall_clock=asyncio.get_running_loop().time,
                secret_bytes=secrets.randbytes,
                switches=WorkerSwitches(metadata_version_fence=fence),
                objects=None if self.objects is None else lambda: self.store_cache(node),
            )

        return make

    def companion(self, sim: SimBookie) -> AutoRecovery | None:
        """The autorecovery running beside the bookie now, if any."""
        if sim.bookie is None:
            return None
        for companion in sim.bookie.companions:
            if isinstance(companion, AutoRecovery):
                return companion
        return None

    async def start_bookie(self, sim: SimBookie) -> bool:
        """Start a bookie's next life; False (traced) when it refuses to boot."""
        if sim.lost_forever:
            return False
        sim.incarnation += 1
        companions = [] if self.autorecovery is None else [self._autorecovery(sim.node)]
        bookie = Bookie(
            sim.config.with_changes(allow_cookie_fix=sim.lost_data),
            disk=sim.disk,
            network=self.net.server_network(sim.node),
            metadata=self.store(),
            repairer=self._repairer(sim.node),
            instance_ids=lambda: f"{self.rng.getrandbits(64):016x}",
            companions=companions,
        )
        try:
            await bookie.start()
        except Exception as exc:
            self.trace(f"{sim.node}: boot refused: {type(exc).__name__}: {exc}")
            return False
        sim.bookie = bookie
        if sim.down_since is not None:
            now = asyncio.get_running_loop().time()
            sim.longest_outage = max(sim.longest_outage, now - sim.down_since)
            sim.down_since = None
        await self._check_fences(sim, bookie)
        self.trace(
            f"{sim.node}: up (life {sim.incarnation}"
            + (", unclean" if bookie.booted.unclean_start else "")
            + (f", limbo {bookie.booted.limbo_ledgers}" if bookie.booted.limbo_ledgers else "")
            + ")"
        )
        return True

    async def _check_fences(self, sim: SimBookie, bookie: Bookie) -> None:
        """I11: every fence this bookie acknowledged is in force in its new life -- from its
        journal, or after a lost disk from boot-time fencing of every ledger whose ensembles
        hold it (closed ones too: bookie/boot.py)."""
        store = self.store()
        for ledger_id in sorted(sim.fenced_acked):
            try:
                metadata = await store.read_ledger(ledger_id)
            except Exception:
                continue
            if sim.lost_data and sim.bookie_id not in metadata.bookies():
                continue  # recovery moved it out of every fragment: phase one has no reason
            if is_released(metadata):
                continue  # offloaded: its bookies drop it, fence and all (the store holds it)
            state = bookie.storage.ledgers.get(ledger_id)
            if state is None or not state.fenced:
                self.violations.append(
                    f"I11 {sim.node} acknowledged a fence of ledger {ledger_id} but booted "
                    f"(life {sim.incarnation}) without it"
                )

    def _retire(self, bookie: Bookie) -> None:
        """Keep what a bookie life's garbage collection (and autorecovery) did, for the run's
        summary."""
        self.gc_ledgers += bookie.stats.gc_ledgers_deleted
        self.gc_logs += bookie.stats.gc_logs_removed
        self.gc_moved += bookie.stats.gc_entries_moved
        self.states_loaded += bookie.stats.ledger_states_loaded
        for companion in bookie.companions:
            if isinstance(companion, AutoRecovery):
                self._add_repairs(companion.stats)

    def _add_repairs(self, stats: AutoRecoveryStats) -> None:
        for name in ("fragments_replicated", "entries_replicated", "ledgers_repaired",
                     "ledgers_recovered", "repair_failures", "auditor_elections"):  # fmt: skip
            setattr(self.repairs, name, getattr(self.repairs, name) + getattr(stats, name))

    async def crash(self, sim: SimBookie, *, clean: bool) -> None:
        bookie, sim.bookie = sim.bookie, None
        if bookie is None:
            return
        self._retire(bookie)
        sim.down_since = asyncio.get_running_loop().time()
        if clean:
            self.trace(f"{sim.node}: clean stop")
            await bookie.stop()
            return
        self.trace(f"{sim.node}: crash")
        self.net.crash(sim.node)
        sim.disk.crash()
        if self.journal_less:
            sim.lost_data = True
        with contextlib.suppress(Exception):
            await bookie.crash()

    async def wipe(self, sim: SimBookie) -> None:
        await self.crash(sim, clean=False)
        self.trace(f"{sim.node}: disk wiped")
        sim.disk.wipe()
        sim.lost_data = True

    async def lose(self, sim: SimBookie) -> None:
        """The bookie's disk and host are gone for good: it never starts again."""
        await self.wipe(sim)
        sim.lost_forever = True
        self.trace(f"{sim.node}: lost for good")

    async def lose_together(self, sims: list[SimBookie]) -> None:
        """Every bookie of ``sims`` lost for good at the same virtual instant (a rack's power
        or switch gone): none of them answers once the first is gone."""
        for sim in sims:
            self.net.crash(sim.node)
        await asyncio.gather(*(self.lose(sim) for sim in sims))

    @property
    def racks(self) -> dict[str, str]:
        """Each bookie's rack, by id."""
        return {sim.bookie_id: sim.config.rack for sim in self.bookies.values()}

    @property
    def lost(self) -> set[str]:
        """The ids of the bookies lost for good."""
        return {sim.bookie_id for sim in self.bookies.values() if sim.lost_forever}

    async def close(self) -> None:
        self.release_holds()
        for bk in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(bk.close(), 5)
        for sim in self.bookies.values():
            if sim.bookie is not None:
                self._retire(sim.bookie)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(sim.bookie.crash(), 5)
        MemoryKV.forget(self.kv_name)
