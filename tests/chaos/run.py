"""One chaos run: etcd and N bookies as subprocesses (each behind a Proxy), writers and tailing
readers in this process, and a nemesis that SIGKILLs, SIGSTOPs, restarts and partitions
bookies -- bounded in count and time, loopback only. At the end every fault is healed, every
ledger recovered and read back, and the simulator's checker judges the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from aiobk.client import BookKeeper, ClientConfig, LedgerHandle
from aiobk.client.quorum import write_set
from aiobk.metadata import EtcdProcess, LedgerMetadata
from aiobk.protocol import ReadRequest, ReadResponse, StatusCode, parse_entry
from aiobk.protocol.errors import BKError
from tests.chaos.proxy import Proxy
from tests.procs import BookieProcess
from tests.sim.checker import _check_ledger, _check_reads, read_closed
from tests.sim.history import Append, History, Observed


@dataclass
class ChaosResult:
    journal_less: bool
    faults: dict[str, int] = field(default_factory=dict)
    appends: int = 0
    acknowledged: int = 0
    ledgers: int = 0
    reads: int = 0
    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def summary(self) -> str:
        mode = "journal-less" if self.journal_less else "with journal"
        return (
            f"chaos {mode}: {sum(self.faults.values())} faults {self.faults}, "
            f"{self.appends} appends ({self.acknowledged} acknowledged) over {self.ledgers} "
            f"ledgers, {self.reads} tailing reads, {len(self.violations)} violations"
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
        config = self.data.parent / f"{self.data.name}.toml"
        config.write_text(
            f'data_dir = "{self.data}"\nregistration_ttl = 3.0\nflush_interval = 1.0\n'
            f"allow_cookie_fix = false\nrepair_retry_interval = 0.5\n"
        )
        args = ["--config", str(config), "--metadata", self.uri]
        args += ["--bookie-id", self.proxy.address, "--advertised-address", self.proxy.address]
        if self.journal_less:
            args.append("--no-journal-write-data")
        self.process.args = args
        await self.process.start()
        self.stopped = False

    @property
    def alive(self) -> bool:
        p = self.process
        return p is not None and p.process is not None and p.process.poll() is None


async def run_chaos(
    seconds: float, faults: int, *, journal_less: bool, bookies: int = 5, seed: int = 0
) -> ChaosResult:
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
    history = History()
    clients: list[BookKeeper] = []
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
        jobs.append(_nemesis(nodes, rng, deadline, faults, journal_less, result, note))
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
        await _check(checker, history, note)
    finally:
        for bk in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(bk.close(), 10)
        for node in nodes:
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
            await asyncio.sleep(0.5)
            if callable(note):
                note(f"{name}: create failed: {exc!r}")
            continue
        history.ledgers[lh.ledger_id] = (3, 3, 2)
        slots = asyncio.Semaphore(rng.choice((1, 8, 32)))
        tasks: list[asyncio.Task[None]] = []
        while loop.time() < deadline and lh.error is None:
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


async def _nemesis(
    nodes: list[_Node],
    rng: random.Random,
    deadline: float,
    faults: int,
    journal_less: bool,
    result: ChaosResult,
    note: object,
) -> None:
    assert callable(note)
    loop = asyncio.get_running_loop()
    killed_without_journal = False
    gap = max(0.2, (deadline - loop.time()) / max(faults, 1))
    for _ in range(faults):
        await asyncio.sleep(rng.uniform(0.5 * gap, gap))
        if loop.time() >= deadline:
            break
        node = rng.choice(nodes)
        proxy, process = node.proxy, node.process
        assert proxy is not None
        assert process is not None
        kind = rng.choice(("kill", "stop", "partition", "reset"))
        if kind == "kill" and journal_less and killed_without_journal:
            kind = "stop"  # a second journal-less kill could lose an entry's every copy
        hold = rng.uniform(0.3, 2.0)
        result.faults[kind] = result.faults.get(kind, 0) + 1
        note(f"{kind} bookie {proxy.address} for {hold:.2f}s")
        if kind == "kill":
            killed_without_journal = journal_less
            process.kill()
            await asyncio.sleep(hold)
            await node.start()
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


async def _check(bk: BookKeeper, history: History, note: object) -> None:
    assert callable(note)
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
        await _check_copies(bk, history, ledger_id, metadata)
    _check_reads(history, final)


async def _check_copies(
    bk: BookKeeper, history: History, ledger_id: int, metadata: LedgerMetadata
) -> None:
    """I3 and I6, asking each bookie of each entry's write set directly."""
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    for entry_id in range(last + 1):
        fragment = metadata.fragment_for(entry_id)
        copies: dict[str, bytes] = {}
        for slot in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum):
            bookie = fragment.ensemble[slot]
            try:
                conn = await bk.pool.get(bookie)
                answer = await conn.send(ReadRequest(conn.next_txn_id(), ledger_id, entry_id), 5)
            except BKError:
                continue
            if isinstance(answer, ReadResponse) and answer.status is StatusCode.EOK and answer.body:
                copies[bookie] = parse_entry(answer.body).payload
        if len(set(copies.values())) > 1:
            history.violations.append(f"I6 ledger {ledger_id} entry {entry_id}: copies differ")
        if len(copies) < metadata.ack_quorum:
            history.violations.append(
                f"I3 ledger {ledger_id} entry {entry_id}: {len(copies)} copies, AQ "
                f"{metadata.ack_quorum}"
            )
