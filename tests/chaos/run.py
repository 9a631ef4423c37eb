"""One chaos run: etcd and N bookies as subprocesses (each behind a Proxy), writers and tailing
readers in this process, a producer process killed again and again (producer.py), and a nemesis
that SIGKILLs, SIGSTOPs, restarts and partitions bookies -- bounded in count and time, loopback
only. At the end every fault is healed, every ledger recovered and read back, the simulator's
checker judges the history, and the producer's log is checked for exactly-once sequences.

Autorecovery runs in every bookie with fast settings (``AUTORECOVERY``), and the nemesis may
also *wipe* a bookie: SIGKILL it, delete its directory, and start a new, empty bookie under a
new id and port in its place, so the count stays at N and the wiped one never returns. A run's
budget keeps it recoverable, as the simulator's does: at most ``wipes`` wipes, each after the
one before it is repaired (no ledger names the wiped bookie, no mark is left), and no data loss
at once with another -- a journal-less kill loses what was not flushed, so in journal-less
runs a kill and a wipe exclude each other until the wipe is repaired, and a wipe never follows a
journal-less kill. After the history's checks, I15 (``restored``): autorecovery quiesces and
every copy each write set names is there, on a live bookie.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiobk.client import BookKeeper, ClientConfig, LedgerHandle
from aiobk.client.quorum import write_set
from aiobk.metadata import EtcdProcess, LedgerMetadata, MetadataStore
from aiobk.protocol import ReadRequest, ReadResponse, StatusCode, parse_entry
from aiobk.protocol.errors import BKError
from tests.chaos.producer import ChaosProducer
from tests.chaos.proxy import Proxy
from tests.chaos.restored import check_restored
from tests.sim.checker import _check_ledger, _check_reads, read_closed
from tests.sim.history import Append, History, Observed
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess

KINDS = ("kill", "stop", "partition", "reset")
# A writer closes its ledger after this many appends and starts another (a log rolling its
# ledgers): closed ledgers mid-run for autorecovery, each small enough that a full check of
# every copy sends a bookie a few thousand reads at once, not tens of thousands (see
# auditor_check_concurrency below).
LEDGER_ENTRIES = 2000
WIPE_CHANCE = 0.2  # of each fault after the first being a wipe, while the budget allows one
WATCH_POLLS = 2000  # a wipe's repair is looked for every 0.5 s, at most this many times
RESTORE_BOUND = 60.0  # seconds autorecovery has, after the final checks, to restore copies
# Autorecovery in every bookie, fast enough for a run of seconds (the defaults wait minutes).
AUTORECOVERY: dict[str, float] = {
    # Absent this long: lost. A killed bookie is back in 1-3 s, so usually it is not; a wiped
    # one is marked about registration_ttl + this after its kill.
    "lost_bookie_recovery_delay": 2.5,
    # The walk for ledgers naming a lost bookie, again: catches a ledger made or changed with
    # it just before its registration lapsed.
    "auditor_periodic_bookie_check_interval": 5.0,
    # No periodic full check during the run; the end asks for one (trigger-audit) over every
    # copy, so a copy missing anywhere in a fragment is found, not only at its ends.
    "auditor_periodic_check_interval": 0.0,
    "auditor_ledger_verification_percentage": 100.0,
    # The check sends every read it samples in a ledger's fragment at once, and these many
    # ledgers at once: tens of thousands in flight stall the auditor's bookie for seconds (its
    # leases lapse, its successor calls it lost). Two ledgers of LEDGER_ENTRIES stay clear.
    "auditor_check_concurrency": 2,
    "open_ledger_rereplication_grace_period": 3.0,
    "rereplication_retry_delay": 0.2,
    "autorecovery_lease_ttl": 2.0,
    "autorecovery_poll_interval": 0.2,
}


@dataclass
class ChaosResult:
    journal_less: bool
    faults: dict[str, int] = field(default_factory=dict)
    appends: int = 0
    acknowledged: int = 0
    ledgers: int = 0
    reads: int = 0
    wiped: list[str] = field(default_factory=list)
    restored_copies: int = 0  # copies read by I15's last looks
    restore_seconds: float = 0.0  # from the audit request until I15 held (or gave up)
    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    producer: str = ""  # what the producer processes did (tests/chaos/producer.py)

    def summary(self) -> str:
        mode = "journal-less" if self.journal_less else "with journal"
        return (
            f"chaos {mode}: {sum(self.faults.values())} faults {self.faults}, "
            f"{self.appends} appends ({self.acknowledged} acknowledged) over {self.ledgers} "
            f"ledgers, {self.reads} tailing reads, {len(self.wiped)} bookies wiped, I15 over "
            f"{self.restored_copies} copies after {self.restore_seconds:.1f}s, "
            f"{self.producer}, {len(self.violations)} violations"
        )


class _Node:
    def __init__(self, base: Path, index: int, uri: str, journal_less: bool) -> None:
        self.data = base / f"bookie{index}"
        self.port = 0
        self.proxy: Proxy | None = None
        self.uri = uri
        self.journal_less = journal_less
        self.process: BookieProcess | None = None
        self.stopped = False

    async def start(self) -> None:
        if self.proxy is None:
            self.process = BookieProcess(self.data)
            self.proxy = Proxy(self.process.port)
            await self.proxy.start()
        assert self.process is not None
        config = self.config_path
        config.write_text(
            f'data_dir = "{self.data}"\nregistration_ttl = 3.0\nflush_interval = 1.0\n'
            f"allow_cookie_fix = false\nrepair_retry_interval = 0.5\n"
            + "".join(f"{k} = {v!r}\n" for k, v in HOST_DISK_SETTINGS.items())
            + "[autorecovery]\n"
            + "".join(f"{k} = {v!r}\n" for k, v in AUTORECOVERY.items())
        )
        args = ["--config", str(config), "--metadata", self.uri]
        args += ["--bookie-id", self.proxy.address, "--advertised-address", self.proxy.address]
        if self.journal_less:
            args.append("--no-journal-write-data")
        self.process.args = args
        await self.process.start()
        self.stopped = False

    @property
    def config_path(self) -> Path:
        return self.data.parent / f"{self.data.name}.toml"

    @property
    def bookie_id(self) -> str:
        assert self.proxy is not None
        return self.proxy.address

    @property
    def alive(self) -> bool:
        p = self.process
        return p is not None and p.process is not None and p.process.poll() is None

    async def wipe(self) -> None:
        """SIGKILL, close the door (its proxy: connections are refused from now on) and delete
        its directory and config: this bookie never comes back."""
        assert self.process is not None
        assert self.proxy is not None
        self.process.kill()
        await self.proxy.stop()
        shutil.rmtree(self.data)
        self.config_path.unlink()


async def run_chaos(
    seconds: float,
    faults: int,
    *,
    journal_less: bool,
    bookies: int = 5,
    seed: int = 0,
    wipes: int = 0,
) -> ChaosResult:
    """``wipes``: at most that many kill-and-wipe-forever faults (see the module docstring)."""
    rng = random.Random(seed)
    result = ChaosResult(journal_less)
    loop = asyncio.get_running_loop()

    def note(text: str) -> None:
        result.log.append(f"{loop.time() - t0:8.3f} {text}")

    t0 = loop.time()
    base = Path(tempfile.mkdtemp(prefix="aiobk-chaos-", dir="."))
    etcd = EtcdProcess(data_dir=str(base / "etcd")).start()
    uri = etcd.uri("chaos")
    nodes = [_Node(base, i, uri, journal_less) for i in range(bookies)]
    every_node = list(nodes)  # with the wiped ones, for the cleanup

    def new_node() -> _Node:
        node = _Node(base, len(every_node), uri, journal_less)
        every_node.append(node)
        return node

    history = History()
    producer = ChaosProducer(uri, base, random.Random(f"producer-{seed}"), note)
    clients: list[BookKeeper] = []
    watchers: list[asyncio.Task[None]] = []
    config = ClientConfig(add_timeout=2.0, read_timeout=2.0, connect_timeout=1.0,
                          long_poll_timeout=1.0, bookie_list_ttl=0.5)  # fmt: skip

    async def client() -> BookKeeper:
        bk = await BookKeeper.connect(uri, config, rng=random.Random(rng.getrandbits(64)))
        clients.append(bk)
        return bk

    try:
        await asyncio.gather(*(n.start() for n in nodes))
        note(f"{bookies} bookies up" + (" (journal-less)" if journal_less else ""))
        deadline = loop.time() + seconds
        jobs = [_writer(f"w{i}", await client(), history, rng, deadline, note) for i in range(2)]
        jobs.append(_reader(await client(), history, rng, deadline))
        jobs.append(producer.run(deadline))
        budget = _Budget(wipes, journal_less, (await client()).store)
        watchers = budget.watchers
        jobs.append(_nemesis(nodes, new_node, rng, deadline, faults, budget, result, note))
        await asyncio.wait_for(asyncio.gather(*jobs), seconds + 120)
        note("healing")
        for node in nodes:
            assert node.proxy is not None
            node.proxy.heal()
            if node.alive and node.stopped and node.process and node.process.process:
                node.process.process.send_signal(signal.SIGCONT)
                node.stopped = False
            if not node.alive:
                await node.start()
        checker = await client()
        wiped = set(result.wiped)
        await _check(checker, history, wiped, note)
        history.violations += await producer.check(checker)
        result.producer = producer.summary()
        restored = await check_restored(checker, sorted(history.ledgers), RESTORE_BOUND, note)
        history.violations += restored.violations
        result.restored_copies = restored.copies
        result.restore_seconds = restored.seconds
    finally:
        producer.kill()
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        for bk in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(bk.close(), 10)
        for node in every_node:
            if node.process is not None and node.process.process is not None:
                with contextlib.suppress(Exception):
                    node.process.process.send_signal(signal.SIGCONT)
                node.process.stop()
            if node.proxy is not None:
                await node.proxy.stop()
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    result.violations = history.violations
    result.appends = len(history.appends)
    result.acknowledged = sum(1 for a in history.appends if a.result == "ok")
    result.ledgers = len(history.ledgers)
    result.reads = len(history.reads)
    return result


async def _writer(
    name: str, bk: BookKeeper, history: History, rng: random.Random, deadline: float, note: object
) -> None:
    loop = asyncio.get_running_loop()
    index = 0
    while loop.time() < deadline:
        try:
            lh = await bk.create_ledger(3, 3, 2)
        except BKError as exc:
            await asyncio.sleep(0.5)  # a backoff before the next try, against real processes
            if callable(note):
                note(f"{name}: create failed: {exc!r}")
            continue
        history.ledgers[lh.ledger_id] = (3, 3, 2)
        slots = asyncio.Semaphore(rng.choice((1, 8, 32)))
        tasks: list[asyncio.Task[None]] = []
        for _entry in range(LEDGER_ENTRIES):
            if loop.time() >= deadline or lh.error is not None:
                break
            await slots.acquire()
            op = Append(lh.ledger_id, f"{name}:{lh.ledger_id}:{index}".encode(), loop.time())
            index += 1
            history.appends.append(op)
            tasks.append(asyncio.create_task(_append(lh, op, slots, history, name)))
            await asyncio.sleep(rng.uniform(0, 0.003))
        await asyncio.gather(*tasks)
        if lh.error is None:
            with contextlib.suppress(BKError):
                await lh.close()
        elif callable(note):
            note(f"{name}: ledger {lh.ledger_id} stopped: {lh.error!r}")


async def _append(
    lh: LedgerHandle, op: Append, slots: asyncio.Semaphore, history: History, name: str
) -> None:
    try:
        op.entry_id = await lh.append(op.value)
        op.result = "ok"
        history.lac(name, lh.ledger_id, lh.last_add_confirmed)
    except BKError as exc:
        op.result = "unknown"
        op.error = repr(exc)
    finally:
        slots.release()


async def _reader(bk: BookKeeper, history: History, rng: random.Random, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    round_ = 0
    while loop.time() < deadline:
        await asyncio.sleep(rng.uniform(0.1, 0.5))
        if not history.ledgers:
            continue
        ledger_id = rng.choice(sorted(history.ledgers))
        who = f"reader#{round_}"
        round_ += 1
        try:
            rh = await bk.open_ledger(ledger_id, recovery=False)
            lac = await rh.read_last_add_confirmed()
            lac = await rh.wait_for_lac(lac, timeout=0.5)
            history.lac(who, ledger_id, rh.last_add_confirmed)
            if lac >= 0:
                for entry in await rh.read(max(0, lac - 20), lac):
                    history.reads.append(
                        Observed(who, ledger_id, entry.entry_id, bytes(entry.data), lac)
                    )
        except BKError:
            continue


class _Budget:
    """What a run may still lose (see the module docstring): data-losing faults one at a time."""

    def __init__(self, wipes: int, journal_less: bool, store: MetadataStore) -> None:
        self.wipes_left = wipes
        self.journal_less = journal_less
        self.store = store
        self.killed_without_journal = False
        self.wiped: set[str] = set()
        self.watchers: list[asyncio.Task[None]] = []

    async def may_lose_data(self) -> bool:
        """No data loss outstanding: no journal-less kill yet, every wipe repaired."""
        if self.killed_without_journal:
            return False
        return not self.wiped or await _repaired(self.store, self.wiped)

    async def may_wipe(self) -> bool:
        return self.wipes_left > 0 and await self.may_lose_data()

    async def may_kill(self) -> bool:
        return not self.journal_less or await self.may_lose_data()

    async def victim(self, nodes: list[_Node], rng: random.Random) -> _Node:
        """The bookie named by the most ledgers (the writers' ones among them): a wipe that
        gives autorecovery work, whatever placement chose."""
        named: dict[str, int] = {}
        with contextlib.suppress(BKError):
            async for _ledger_id, metadata in self.store.scan_ledgers():
                for bookie in metadata.bookies() if metadata is not None else ():
                    named[bookie] = named.get(bookie, 0) + 1
        return max(nodes, key=lambda node: (named.get(node.bookie_id, 0), rng.random()))

    def watch(self, bookie_id: str, note: Callable[[str], None]) -> None:
        """Note when autorecovery has repaired a wipe (polled until the run ends)."""

        async def poll() -> None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            for _poll in range(WATCH_POLLS):  # the run's end cancels it sooner
                if await _repaired(self.store, {bookie_id}):
                    note(f"wipe of {bookie_id} repaired {loop.time() - start:.1f}s after it")
                    return
                await asyncio.sleep(0.5)  # a watcher's pace: it notes a repair, nothing waits on it

        self.watchers.append(asyncio.get_running_loop().create_task(poll()))


async def _repaired(store: MetadataStore, wiped: set[str]) -> bool:
    """The wiped bookies' registrations have lapsed (no new ensemble can pick them), no ledger
    names one, and no mark is waiting for a worker."""
    try:
        if wiped & {info.bookie_id for info in await store.list_bookies()}:
            return False
        async for mark in store.autorecovery.marks():
            if mark.missing:
                return False
        async for _ledger_id, metadata in store.scan_ledgers():
            if metadata is not None and metadata.bookies() & wiped:
                return False
    except BKError:
        return False
    return True


async def _nemesis(
    nodes: list[_Node],
    new_node: Callable[[], _Node],
    rng: random.Random,
    deadline: float,
    faults: int,
    budget: _Budget,
    result: ChaosResult,
    note: Callable[[str], None],
) -> None:
    """Faults every ``gap``; a bookie's (re)start runs beside the next faults, not before them
    (a start can take seconds on a loaded machine: it held a short run to one fault). A bookie
    on its way back is out of the draw, and the nemesis waits for every start before it ends."""
    loop = asyncio.get_running_loop()
    gap = max(0.2, (deadline - loop.time()) / max(faults, 1))
    starting: set[_Node] = set()
    starts: list[asyncio.Task[None]] = []

    def start_later(node: _Node, hold: float, done: str) -> None:
        async def start() -> None:
            try:
                await asyncio.sleep(hold)
                await node.start()
                note(done.format(node.bookie_id))
            finally:
                starting.discard(node)

        starting.add(node)
        starts.append(loop.create_task(start()))

    try:
        for number in range(faults):
            await asyncio.sleep(rng.uniform(0.5 * gap, gap))
            if loop.time() >= deadline:
                break
            ready = [n for n in nodes if n not in starting]
            if not ready:
                continue
            node = rng.choice(ready)
            proxy, process = node.proxy, node.process
            assert proxy is not None
            assert process is not None
            kind = rng.choice(KINDS)
            hold = rng.uniform(0.3, 2.0)
            # The first fault wipes (so a short run has one, repaired while writers go on);
            # later ones now and then, once the last wipe is repaired.
            if (number == 0 or rng.random() < WIPE_CHANCE) and await budget.may_wipe():
                result.faults["wipe"] = result.faults.get("wipe", 0) + 1
                victim = await budget.victim(ready, rng)
                note(f"wipe bookie {victim.bookie_id}: killed, its directory deleted, never back")
                budget.wipes_left -= 1
                budget.wiped.add(victim.bookie_id)
                result.wiped.append(victim.bookie_id)
                await victim.wipe()
                budget.watch(victim.bookie_id, note)
                fresh = new_node()
                nodes[nodes.index(victim)] = fresh  # out of the draw until it has started
                start_later(fresh, hold, "bookie {} started in its place (empty)")
                continue
            if kind == "kill" and not await budget.may_kill():
                kind = "stop"  # a journal-less kill now could take an entry's last copy
            result.faults[kind] = result.faults.get(kind, 0) + 1
            note(f"{kind} bookie {proxy.address} for {hold:.2f}s")
            if kind == "kill":
                budget.killed_without_journal |= budget.journal_less
                process.kill()
                start_later(node, hold, "bookie {} restarted")
            elif kind == "stop" and process.process is not None:
                process.process.send_signal(signal.SIGSTOP)
                node.stopped = True
                await asyncio.sleep(hold)
                process.process.send_signal(signal.SIGCONT)
                node.stopped = False
            elif kind == "partition":
                proxy.hold()
                await asyncio.sleep(hold)
                proxy.heal()
            else:
                proxy.reset()
    finally:
        await asyncio.gather(*starts)


async def _check(
    bk: BookKeeper, history: History, wiped: set[str], note: Callable[[str], None]
) -> None:
    final: dict[int, LedgerMetadata] = {}
    for ledger_id in sorted(history.ledgers):
        handle = None
        for _attempt in range(20):
            try:
                handle = await bk.open_ledger(ledger_id, recovery=True)
                break
            except BKError as exc:
                note(f"check: recovery of {ledger_id}: {exc!r}")
                await asyncio.sleep(1.0)
        if handle is None:
            history.violations.append(f"I13 ledger {ledger_id} cannot be recovered after healing")
            continue
        metadata = final[ledger_id] = handle.metadata
        last, values = await read_closed(history, handle)
        _check_ledger(history, ledger_id, last, values)
        await _check_copies(bk, history, ledger_id, metadata, wiped)
    _check_reads(history, final)


async def _check_copies(
    bk: BookKeeper, history: History, ledger_id: int, metadata: LedgerMetadata, wiped: set[str]
) -> None:
    """I3 and I6, asking each bookie of each entry's write set directly (a wiped bookie's
    copies excused, as a bookie that lost data: I15 judges them once autorecovery ran)."""
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    for entry_id in range(last + 1):
        fragment = metadata.fragment_for(entry_id)
        copies: dict[str, bytes] = {}
        excused = 0
        for slot in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum):
            bookie = fragment.ensemble[slot]
            if bookie in wiped:
                excused += 1
                continue
            try:
                conn = await bk.pool.get(bookie)
                answer = await conn.send(ReadRequest(conn.next_txn_id(), ledger_id, entry_id), 5)
            except BKError:
                continue
            if isinstance(answer, ReadResponse) and answer.status is StatusCode.EOK and answer.body:
                copies[bookie] = parse_entry(answer.body).payload
        if len(set(copies.values())) > 1:
            history.violations.append(f"I6 ledger {ledger_id} entry {entry_id}: copies differ")
        if len(copies) < metadata.ack_quorum - excused:
            history.violations.append(
                f"I3 ledger {ledger_id} entry {entry_id}: {len(copies)} copies, AQ "
                f"{metadata.ack_quorum}"
            )
