"""Re-replication throughput after a bookie is lost for good, against the same run's disk copy
floor: target >= 0.30 x the floor with the throttle off.

Per entry size (``--entry-size``, a comma list): a real etcd and ``--bookies`` bookie processes
(data on one disk, their own autorecovery off) take ``--megabytes`` of payload through the client
into ``--ledgers`` closed E3 WQ3 AQ2 ledgers, pipelined. After a checkpoint the bookie named in the
most ledgers is killed (SIGKILL) and its directory deleted; the survivors' files are evicted from
the page cache, so the copies are read cold as a real recovery reads them. Then, in this process:

1. **detect**: once the bookie's registration lease has lapsed, an auditor
   (``aiobk.autorecovery.AutoRecovery``, no worker) with ``lost_bookie_recovery_delay = 0``
   runs until every ledger that named the lost bookie is marked under-replicated; then it
   stops (it would otherwise poll the registry every 50 ms beside the workers).
2. **re-replicate**: ``--workers`` AutoRecovery services (worker only, ``--in-flight`` entries
   each, ``--throttle`` bytes/s each, 0 = off) run from the moment the marks are all there until
   none remains. MB/s = the workers' ``bytes_replicated`` / those seconds, cross-checked against
   what the lost bookie held (its entries x stored body size, from the ledgers' metadata).
3. **floor**: the same number of bytes copied on the same disk by one thread: read from a cold
   file (posix_fadvise DONTNEED) and written to another, each chunk followed by fdatasync.
   Chunks of the bookie's entry-log write buffer (4 MiB: the judged floor) and of the journal's
   group-commit threshold (512 KiB, reported). Three passes before the kill and three after
   step 2 (once the bookies have checkpointed the copies), each group after a ``sync``; the
   floor is their median (this disk is much slower right after a large write than a second
   later: the passes show both, and so does the re-replication, which writes all the time).

The target is judged on the first ``--entry-size`` (64 KiB by default); the others are reported.
At 1 KiB, 30% of a disk's copy rate is a hundred thousand entries a second, past what a bookie's
request path does at any entry size: small entries measure the per-entry cost (entries/s).

Reported beside the rate: the CPU the workers (this process) and the bookies spent per entry
copied -- steady from run to run where the rates are not, on a shared machine -- and their
share of a core while copying, and the bookies' journal fdatasyncs. A benchmark reports a
missed target; it does not fail (``--fail-on-miss``).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import click
import uvloop
from rich.console import Console
from rich.table import Table

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
from aiobk.bench.targets import fail_on_miss_option, module_main, report_checks, write_report
from aiobk.bookie import BookieConfig
from aiobk.client import BookieConnection, BookKeeper
from aiobk.metadata import EtcdProcess, LedgerMetadata, MetadataStore, open_store
from aiobk.protocol import HEADER_SIZE, DigestType, GetBookieInfoRequest, GetBookieInfoResponse

TARGET = 0.30
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


async def _counters(ports: dict[str, int]) -> dict[str, dict[str, int]]:
    """Each bookie's request and sync counters (GET_BOOKIE_INFO)."""
    out: dict[str, dict[str, int]] = {}
    for bookie, port in ports.items():
        conn = await BookieConnection.open("127.0.0.1", port)
        try:
            response = await conn.call(GetBookieInfoRequest(0), 10)
        finally:
            conn.close()
        assert isinstance(response, GetBookieInfoResponse)
        out[bookie] = {name: int(response.stats.get(name, 0)) for name in COUNTERS}
    return out


async def _wait_checkpoint(ports: dict[str, int], limit: float) -> None:
    """Until every bookie has checkpointed once more (entries in their entry logs, the write
    caches empty), at most ``limit`` seconds."""

    async def checkpoints() -> dict[str, int]:
        found: dict[str, int] = {}
        for bookie, port in ports.items():
            conn = await BookieConnection.open("127.0.0.1", port)
            try:
                response = await conn.call(GetBookieInfoRequest(0), 10)
            finally:
                conn.close()
            assert isinstance(response, GetBookieInfoResponse)
            found[bookie] = int(response.stats.get("checkpoints", 0))
        return found

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


def _disk_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _dirs, names in os.walk(path)
        for name in names
    )


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
        run.lost_disk_bytes = _disk_bytes(os.path.join(dirs[victim], "ledgers"))
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


# ---------------------------------------------------------------------- the report


def checks(runs: list[Run]) -> list[dict[str, Any]]:
    """The target, judged on the first entry size (see the module docstring)."""
    found = []
    for run in runs[:1]:
        ratio = run.ratio()
        whole = run.entries_replicated == run.lost_entries and not run.timed_out
        found.append({
            "target": f"re-replication >= {TARGET:.2f} x disk copy floor "
                      f"({_size(run.entry_size)} entries)",
            "ratio": round(ratio, 3),
            "mb_s": round(run.mb_s, 1),
            "floor_mb_s": round(run.floor(FLOOR_CHUNKS[0]), 1),
            "complete": whole and run.still_naming_lost == 0,
            "pass": ratio >= TARGET and whole,
        })  # fmt: skip
    return found


def _per_entry(cpu_s: float, run: Run) -> str:
    return f"{cpu_s * 1e6 / run.entries_replicated:.0f}" if run.entries_replicated else "-"


def _size(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def print_table(console: Console, runs: list[Run]) -> None:
    chunk, journal_chunk = FLOOR_CHUNKS
    table = Table(
        title=f"re-replication of a lost bookie's copies, E{ENSEMBLE} WQ{WRITE_QUORUM} "
        f"AQ{ACK_QUORUM}, against copying the same bytes on the same disk (read cold + write "
        f"+ fdatasync per {_size(chunk)} chunk; median of {FLOOR_PASSES} passes before and "
        f"{FLOOR_PASSES} after)"
    )
    columns = (
        "entry", "lost bookie held", "workers x in flight", "copied", "seconds", "MB/s",
        "entries/s",
        f"floor {_size(chunk)}", "ratio", f"floor {_size(journal_chunk)}", "ratio ",
        "CPU us/entry worker + bookies", "journal fdatasyncs", "",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for index, run in enumerate(runs):
        ratio = run.ratio()
        verdict = "[green]PASS[/green]" if ratio >= TARGET else "[red]MISS[/red]"
        if index:
            verdict = "reported"
        syncs = sum(c["journal_syncs"] for c in run.bookie_counters.values())
        table.add_row(
            _size(run.entry_size),
            f"{run.lost_bytes / MB:.1f} MB, {run.lost_ledgers} ledgers",
            f"{run.workers} x {run.in_flight}",
            f"{run.bytes_replicated / MB:.1f} MB"
            + ("" if run.entries_replicated == run.lost_entries else " (INCOMPLETE)"),
            f"{run.rereplication_s:.2f}" + (" (timed out)" if run.timed_out else ""),
            f"{run.mb_s:.1f}",
            f"{run.entries_s:,.0f}",
            f"{run.floor(chunk):.0f}",
            f"{ratio:.3f}",
            f"{run.floor(journal_chunk):.0f}",
            f"{run.ratio(journal_chunk):.3f}",
            f"{_per_entry(run.worker_cpu_s, run)} + {_per_entry(run.bookies_cpu_s, run)}",
            f"{syncs:,}",
            verdict,
        )
    console.print(table)
    for run in runs:
        seconds = run.rereplication_s or 1.0
        per_bookie = ", ".join(
            f"{b} {c['adds']:,} adds {c['reads']:,} reads {c['journal_syncs']:,} syncs "
            f"{run.cpu_s.get(b, 0.0):.1f} CPU s"
            for b, c in run.bookie_counters.items()
        )
        console.print(
            f"{_size(run.entry_size)}: loaded {run.entries_loaded:,} entries in {run.load_s} s; "
            f"lost {run.lost_bookie} (ledger storage {run.lost_disk_bytes / MB:.1f} MB on disk), "
            f"unregistered {run.unregistered_s} s after SIGKILL, all marked {run.marked_s} s "
            f"after the auditor started; {run.ledgers_repaired} ledgers "
            f"repaired, {run.repair_failures} failed attempts, {run.still_naming_lost} still "
            f"name it; while copying, CPU of the worker {run.worker_cpu_s / seconds:.0%} and of "
            f"the bookies {run.bookies_cpu_s / seconds:.0%} of one core, etcd "
            f"{run.cpu_s.get('etcd', 0.0):.1f} s; floor passes {_size(chunk)} "
            f"{' '.join(f'{rate:.0f}' for rate in run.floor_mb_s.get(str(chunk), []))} MB/s; "
            f"{per_bookie}",
            highlight=False,
        )


def _ints(_ctx: click.Context | None, _param: click.Parameter | None, value: str) -> list[int]:
    try:
        found = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected a comma list of integers, got {value!r}") from None
    if not found or any(v < 1 for v in found):
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return found


def _floats(
    _ctx: click.Context | None, _param: click.Parameter | None, value: str
) -> list[float]:  # fmt: skip
    try:
        found = [float(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected a comma list of numbers, got {value!r}") from None
    if not found or any(not v > 0 for v in found):
        raise click.BadParameter(f"expected positive numbers, got {value!r}")
    return found


@click.command(
    "autorecovery", help=__doc__,
    short_help="Re-replication of a lost bookie, against the disk copy floor.",
)  # fmt: skip
@click.option(
    "--megabytes", default="512,32", show_default=True, callback=_floats,
    help="Payload MB (10^6 bytes) loaded per entry size: a comma list paired with "
    "--entry-size, or one value for every size.",
)  # fmt: skip
@click.option(
    "--entry-size", "entry_sizes", default="65536,1024", show_default=True, callback=_ints,
    help="Comma list of entry payload sizes in bytes; each runs on a fresh cluster.",
)  # fmt: skip
@click.option(
    "--ledgers", type=click.IntRange(1, 10_000), default=16, show_default=True,
    help="Closed E3 WQ3 AQ2 ledgers loaded before the kill.",
)  # fmt: skip
@click.option(
    "--bookies", type=click.IntRange(4, 16), default=4, show_default=True,
    help="Bookie processes; the one named most is killed and wiped.",
)  # fmt: skip
@click.option(
    "--workers", type=click.IntRange(1, 16), default=1, show_default=True,
    help="AutoRecovery services (one worker each) in this process.",
)  # fmt: skip
@click.option(
    "--in-flight", type=click.IntRange(1, 100_000),
    default=AutoRecoveryConfig().rereplication_entries_in_flight, show_default=True,
    help="rereplication_entries_in_flight of each worker.",
)  # fmt: skip
@click.option(
    "--throttle", type=click.IntRange(0), default=0, show_default=True,
    help="rereplication_max_bytes_per_second of each worker (0: off, the default).",
)  # fmt: skip
@click.option(
    "--timeout", type=click.FloatRange(1), default=900.0, show_default=True,
    help="Seconds allowed for each phase (load, detection, re-replication).",
)  # fmt: skip
@click.option(
    "--dir", "directory", type=click.Path(file_okay=False), default=None,
    help="Where the bookies and the floor's files go (default: a temporary directory under "
    "the current one, i.e. the project's disk).",
)  # fmt: skip
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), default=None,
    help="Result file (default bench/results/autorecovery-TIMESTAMP.json).",
)  # fmt: skip
@click.option(
    "--cprofile", "cprofile_path", type=click.Path(dir_okay=False), default=None,
    help="Write a cProfile of the workers while re-replicating: CPU time of this process's "
    "event loop thread, pstats format (it slows them).",
)  # fmt: skip
@fail_on_miss_option()
def command(
    megabytes: list[float],
    entry_sizes: list[int],
    ledgers: int,
    bookies: int,
    workers: int,
    in_flight: int,
    throttle: int,
    timeout: float,
    directory: str | None,
    json_path: str | None,
    cprofile_path: str | None,
    fail_on_miss: bool,
) -> int:
    if len(megabytes) not in (1, len(entry_sizes)):
        raise click.BadParameter(
            f"{len(megabytes)} values for {len(entry_sizes)} entry sizes",
            param_hint="--megabytes",
        )
    sizes_mb = megabytes * len(entry_sizes) if len(megabytes) == 1 else megabytes
    console = Console(width=200)
    profile = cProfile.Profile(time.thread_time) if cprofile_path else None
    base = tempfile.mkdtemp(prefix="aiobk-bench-autorecovery-", dir=directory or os.getcwd())
    runs: list[Run] = []
    etcd = EtcdProcess(data_dir=os.path.join(base, "etcd")).start()
    try:
        for size, mb in zip(entry_sizes, sizes_mb, strict=True):
            run = Run(size, mb, ledgers, bookies, workers, in_flight, throttle)
            sub = os.path.join(base, f"size-{size}")
            os.makedirs(sub)
            try:
                runs.append(measure(run, etcd, sub, timeout, profile))
            finally:
                shutil.rmtree(sub, ignore_errors=True)
    finally:
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    print_table(console, runs)
    found = checks(runs)
    report = {
        "target_ratio": TARGET,
        "floor_chunks": list(FLOOR_CHUNKS),
        "runs": [
            {**asdict(r), "mb_s": round(r.mb_s, 2), "entries_s": round(r.entries_s),
             "ratio": round(r.ratio(), 4),
             "floor_judged_mb_s": round(r.floor(FLOOR_CHUNKS[0]), 1),
             "worker_cpu_us_per_entry": _per_entry(r.worker_cpu_s, r),
             "bookies_cpu_us_per_entry": _per_entry(r.bookies_cpu_s, r)}
            for r in runs
        ],
        "checks": found,
    }  # fmt: skip
    path = write_report("autorecovery", report, json_path)
    console.print(f"wrote {path}")
    if profile is not None and cprofile_path is not None:
        profile.dump_stats(cprofile_path)
        console.print(f"wrote {cprofile_path} (python -m pstats {cprofile_path})")
    return report_checks(console, found, fail_on_miss)


main = module_main(command, "autorecovery")


if __name__ == "__main__":
    main()
