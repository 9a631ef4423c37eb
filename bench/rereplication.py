"""The measurement of ``aiobk bench autorecovery`` (the method is that command's help,
``bench/autorecovery.py``): per entry size, a cluster loaded, its most-named bookie lost,
an auditor to mark what it held, workers to copy it again, and the same bytes copied on the
same disk by one thread for the floor. ``measure`` fills a ``Run``; the command judges and
prints it.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import uvloop

from aiobk.autorecovery import AutoRecovery, AutoRecoveryConfig
from aiobk.autorecovery.fragments import closed_fragments, slot_entries
from aiobk.bench.cluster import start_bookie, stop_bookies
from aiobk.bench.floors import (
    MB,
    copy_floor,
    evict_files,
    make_copy_source,
    own_cpu_seconds,
    process_cpu_seconds,
)
from aiobk.bench.resources import disk_bytes
from aiobk.bookie import BookieConfig
from aiobk.client import BookieConnection, BookKeeper
from aiobk.metadata import EtcdProcess, LedgerMetadata, MetadataStore, open_store
from aiobk.protocol import HEADER_SIZE, DigestType, GetBookieInfoRequest, GetBookieInfoResponse

DIGEST = DigestType.CRC32C  # the client's default: a stored body is payload + 38 bytes
BODY_OVERHEAD = HEADER_SIZE + DIGEST.size
# The bookie's defaults: entry-log write buffer (the judged floor's chunk) and the journal's
# group-commit threshold (the largest write one journal fdatasync covers, reported).
_DEFAULTS = BookieConfig(data_dir="unused")
FLOOR_CHUNKS = (_DEFAULTS.entry_log_write_buffer, _DEFAULTS.journal_buffered_writes_threshold)
ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
POLL = 0.05  # seconds between looks at the workers' progress
WORKER = "worker (this process)"  # its key in Run.cpu_s, beside the bookies' ids and etcd


@dataclass
class Run:
    entry_size: int
    megabytes: float
    ledgers: int
    bookies: int
    workers: int
    in_flight: int
    throttle: int
    entries_loaded: int = 0
    load_s: float = 0.0
    lost_bookie: str = ""
    lost_ledgers: int = 0  # ledgers that named it
    lost_entries: int = 0  # entries it held (each a body of entry_size + 38 bytes)
    lost_bytes: int = 0  # ... their bytes: what must be re-replicated
    lost_disk_bytes: int = 0  # its ledger storage on disk when killed (entry logs, index)
    unregistered_s: float = 0.0  # SIGKILL -> gone from the registry (its lease lapsed)
    marked_s: float = 0.0  # the auditor's start -> every ledger naming it marked
    rereplication_s: float = 0.0
    bytes_replicated: int = 0  # AutoRecoveryStats, summed over the workers
    entries_replicated: int = 0
    ledgers_repaired: int = 0
    repair_failures: int = 0
    still_naming_lost: int = 0  # ledgers whose metadata names the lost bookie afterwards
    marks_left: int = 0
    timed_out: bool = False
    floor_mb_s: dict[str, list[float]] = field(default_factory=dict)  # chunk -> passes
    cpu_s: dict[str, float] = field(default_factory=dict)  # while re-replicating
    bookie_counters: dict[str, dict[str, int]] = field(default_factory=dict)  # deltas

    @property
    def mb_s(self) -> float:
        return self.bytes_replicated / MB / self.rereplication_s if self.rereplication_s else 0.0

    @property
    def entries_s(self) -> float:
        return self.entries_replicated / self.rereplication_s if self.rereplication_s else 0.0

    @property
    def worker_cpu_s(self) -> float:
        return self.cpu_s.get(WORKER, 0.0)

    @property
    def bookies_cpu_s(self) -> float:
        return sum(v for k, v in self.cpu_s.items() if k not in (WORKER, "etcd"))

    def floor(self, chunk: int) -> float:
        """The median of the passes (MB/s)."""
        passes = self.floor_mb_s.get(str(chunk), [])
        return statistics.median(passes) if passes else 0.0

    def ratio(self, chunk: int = FLOOR_CHUNKS[0]) -> float:
        floor = self.floor(chunk)
        return self.mb_s / floor if floor else 0.0


# ---------------------------------------------------------------------- the disk floor


FLOOR_PASSES = 3  # per chunk size, before the kill and again after re-replicating


def floor_passes(run: Run, source: str, directory: str) -> None:
    os.sync()  # nothing else's writeback in the way (the bookies have checkpointed)
    for _ in range(FLOOR_PASSES):
        for chunk in FLOOR_CHUNKS:
            rate = copy_floor(source, directory, run.lost_bytes, chunk)
            run.floor_mb_s.setdefault(str(chunk), []).append(round(rate, 1))


# ---------------------------------------------------------------------- the cluster


def _bookie_config(path: str, uri: str) -> str:
    """The bookies' settings: their own autorecovery off (the copying timed is this process's),
    a short registration lease (the loss shows in seconds), checkpoints every 2 s, no GC."""
    with open(path, "w") as out:
        out.write(
            f'metadata_uri = "{uri}"\nautorecovery_enabled = false\nregistration_ttl = 2.0\n'
            "flush_interval = 2.0\ngc_interval = 0\ndisk_reserved_space = 0\n"
        )
    return path


COUNTERS = ("adds", "add_bytes", "reads", "journal_syncs", "journal_bytes", "storage_syncs")


async def _counters(
    ports: dict[str, int], names: Sequence[str] = COUNTERS
) -> dict[str, dict[str, int]]:
    """Each bookie's counters ``names`` (GET_BOOKIE_INFO; 0 for one it does not keep): by
    default its request and sync counters."""
    out: dict[str, dict[str, int]] = {}
    for bookie, port in ports.items():
        conn = await BookieConnection.open("127.0.0.1", port)
        try:
            response = await conn.call(GetBookieInfoRequest(0), 10)
        finally:
            conn.close()
        assert isinstance(response, GetBookieInfoResponse)
        out[bookie] = {name: int(response.stats.get(name, 0)) for name in names}
    return out


async def _wait_checkpoint(ports: dict[str, int], limit: float) -> None:
    """Until every bookie has checkpointed once more (entries in their entry logs, the write
    caches empty), at most ``limit`` seconds."""

    async def checkpoints() -> dict[str, int]:
        counted = await _counters(ports, ("checkpoints",))
        return {bookie: figures["checkpoints"] for bookie, figures in counted.items()}

    before = await checkpoints()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await checkpoints()
        if all(now[b] >= before[b] + 1 for b in before):
            return


async def load(uri: str, run: Run, timeout: float) -> list[int]:
    """``run.megabytes`` of payload into ``run.ledgers`` closed ledgers, every ledger's
    appends submitted at once (the client's budget holds them back); the ledger ids."""
    per_ledger = max(1, round(run.megabytes * MB / run.entry_size / run.ledgers))
    payload = os.urandom(run.entry_size)
    async with BookKeeper(uri) as bk:
        handles = [
            await bk.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM, digest_type=DIGEST)
            for _ in range(run.ledgers)
        ]

        async def fill(index: int) -> None:
            handle = handles[index]
            confirmations = []
            for _ in range(per_ledger):
                _entry_id, confirmed = await handle.submit(payload)
                confirmations.append(confirmed)
            await asyncio.gather(*confirmations)
            await handle.close()

        started = time.perf_counter()
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(fill(i) for i in range(run.ledgers)))
        run.load_s = round(time.perf_counter() - started, 2)
    run.entries_loaded = per_ledger * run.ledgers
    return [handle.ledger_id for handle in handles]


def held_entries(metadata: LedgerMetadata, bookie: str) -> int:
    """Entries of a closed ledger that ``bookie`` is named to hold."""
    held = 0
    for fragment in closed_fragments(metadata):
        for slot, named in enumerate(fragment.ensemble):
            if named == bookie:
                held += sum(
                    1
                    for _ in slot_entries(
                        fragment.first, fragment.last, slot,
                        metadata.ensemble_size, metadata.write_quorum,
                    )
                )  # fmt: skip
    return held


async def _ledger_metadata(uri: str, ids: list[int]) -> list[LedgerMetadata]:
    store = open_store(uri)
    try:
        return [await store.read_ledger(ledger_id) for ledger_id in ids]
    finally:
        await store.close()


def _recovery_config(run: Run) -> AutoRecoveryConfig:
    return AutoRecoveryConfig(
        lost_bookie_recovery_delay=0.0,
        auditor_periodic_check_interval=0.0,  # never: only the lost-bookie check
        rereplication_max_bytes_per_second=run.throttle,
        rereplication_entries_in_flight=run.in_flight,
        rereplication_retry_delay=1.0,
        autorecovery_poll_interval=0.2,
    )


async def _live_marks(store: MetadataStore) -> int:
    """Marks that still name a bookie whose copies are missing."""
    return sum(1 for mark in [m async for m in store.autorecovery.marks()] if mark.missing)


async def rereplicate(
    uri: str,
    run: Run,
    ids: list[int],
    killed_at: float,
    ports: dict[str, int],
    pids: dict[str, int],
    timeout: float,
    profile: cProfile.Profile | None,
) -> None:
    """Steps 1 and 2 of the module docstring; fills ``run``."""
    store = open_store(uri)
    config = _recovery_config(run)
    services: list[AutoRecovery] = []
    try:
        # 1. detect: the registration lapses, the auditor marks every ledger naming the bookie
        deadline = time.monotonic() + timeout
        while any(i.bookie_id == run.lost_bookie for i in await store.list_bookies()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{run.lost_bookie} is still registered")
            await asyncio.sleep(0.1)
        run.unregistered_s = round(time.monotonic() - killed_at, 2)
        started = time.perf_counter()
        auditor = AutoRecovery(
            store, config, "bench-auditor", wall_clock=time.time, secret_bytes=os.urandom,
            run_worker=False,
        )  # fmt: skip
        services.append(auditor)
        await auditor.start()
        deadline = time.monotonic() + timeout
        while await _live_marks(store) < run.lost_ledgers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the auditor did not mark {run.lost_ledgers} ledgers in time")
            await asyncio.sleep(0.1)
        run.marked_s = round(time.perf_counter() - started, 2)
        await auditor.stop()
        services.clear()

        # 2. re-replicate: the workers, from all marks there to none
        before = await _counters(ports)
        cpu_before = {b: process_cpu_seconds(pid) for b, pid in pids.items()}
        own_before = own_cpu_seconds()
        workers = [
            AutoRecovery(
                store, config, f"bench-worker-{i}", wall_clock=time.time,
                secret_bytes=os.urandom, run_auditor=False,
            )
            for i in range(run.workers)
        ]  # fmt: skip
        if profile is not None:
            profile.enable()
        started = time.perf_counter()
        for worker in workers:
            services.append(worker)
            await worker.start()
        deadline = time.monotonic() + timeout
        next_look = 0.0
        while True:  # bounded by the deadline
            repaired = sum(w.stats.ledgers_repaired for w in workers)
            now = time.monotonic()
            elapsed = time.perf_counter() - started
            if (repaired >= run.lost_ledgers or now >= next_look) and not await _live_marks(store):
                break  # the time is taken before the look: the look is not the workers'
            if repaired < run.lost_ledgers and now >= next_look:
                next_look = now + 1.0
            if now > deadline:
                run.timed_out = True
                break
            await asyncio.sleep(POLL)
        if profile is not None:
            profile.disable()
        run.rereplication_s = round(elapsed, 3)
        run.cpu_s = {
            b: round(process_cpu_seconds(pid) - cpu_before[b], 2) for b, pid in pids.items()
        }
        run.cpu_s[WORKER] = round(own_cpu_seconds() - own_before, 2)
        after = await _counters(ports)
        run.bookie_counters = {
            b: {name: after[b][name] - before[b][name] for name in COUNTERS} for b in after
        }
        for worker in workers:
            await worker.stop()
        services.clear()
        for name in ("bytes_replicated", "entries_replicated", "ledgers_repaired",
                     "repair_failures"):  # fmt: skip
            setattr(run, name, sum(getattr(w.stats, name) for w in workers))
        run.marks_left = await _live_marks(store)
        for ledger_id in ids:
            fragments = (await store.read_ledger(ledger_id)).fragments
            run.still_naming_lost += any(run.lost_bookie in f.ensemble for f in fragments)
    finally:
        for service in services:
            await service.stop()
        await store.close()


def measure(
    run: Run, etcd: EtcdProcess, base: str, timeout: float, profile: cProfile.Profile | None
) -> Run:
    """One entry size on a fresh cluster under ``base`` (see the module docstring)."""
    uri = etcd.uri(f"autorecovery-{run.entry_size}")
    config = _bookie_config(os.path.join(base, "bookie.toml"), uri)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    dirs: dict[str, str] = {}
    try:
        for index in range(run.bookies):
            data = os.path.join(base, f"bookie{index}")
            proc, port = start_bookie(data, extra=["--config", config])
            bookie = f"127.0.0.1:{port}"
            procs[bookie], ports[bookie], dirs[bookie] = proc, port, data
        ids = uvloop.run(load(uri, run, timeout))
        metadata = uvloop.run(_ledger_metadata(uri, ids))
        held = {b: sum(held_entries(m, b) for m in metadata) for b in procs}
        victim = max(held, key=lambda b: (held[b], b))
        run.lost_bookie = victim
        run.lost_entries = held[victim]
        run.lost_ledgers = sum(1 for m in metadata if held_entries(m, victim))
        run.lost_bytes = held[victim] * (run.entry_size + BODY_OVERHEAD)
        uvloop.run(_wait_checkpoint(ports, 15.0))
        floor_dir = os.path.join(base, "floor")
        os.makedirs(floor_dir, exist_ok=True)
        source = make_copy_source(floor_dir, run.lost_bytes)
        floor_passes(run, source, floor_dir)

        # Lose it for good: SIGKILL, then its directory goes.
        run.lost_disk_bytes = disk_bytes(os.path.join(dirs[victim], "ledgers"))
        proc = procs.pop(victim)
        proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
        del ports[victim]
        shutil.rmtree(dirs.pop(victim), ignore_errors=True)
        evict_files(list(dirs.values()))  # the survivors' copies are read cold
        pids = {b: p.pid for b, p in procs.items()}
        if etcd.pid is not None:
            pids["etcd"] = etcd.pid
        uvloop.run(rereplicate(uri, run, ids, killed_at, ports, pids, timeout, profile))
        uvloop.run(_wait_checkpoint(ports, 15.0))  # the copies' entry logs written
        floor_passes(run, source, floor_dir)
        os.remove(source)
    finally:
        stop_bookies(list(procs.values()))
    return run
