"""One simulated run from one seed: build the world, run writers, readers and the nemesis
together, heal, check. Everything happens on a virtual-time loop (async-solipsism): a timer an
hour away costs nothing, and a run with nothing left to do but wait fails as a hang.

Replaying a seed reproduces the run exactly, given the same ``PYTHONHASHSEED`` (the iteration
order of sets of strings depends on it; ``make sim`` and ``make test`` both pin it to 0). Sets
of other objects iterate in the order of their addresses, which no seed pins: code the
simulator runs keeps what it iterates -- tasks it cancels, waiters it wakes, connections it
resets -- in insertion-ordered dicts or lists, and the tasks it keeps in ``aiobk.tasks.TaskKeeper``
(the replay tests shift the second run's objects in memory to catch one that does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import random
import traceback
import warnings
from collections.abc import Coroutine, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import async_solipsism

from tests.sim.checker import check, heal
from tests.sim.history import History, WireTap
from tests.sim.loop import SimLoop, SpinError
from tests.sim.loss import PLANS, Loss, autorecovery_config
from tests.sim.nemesis import Nemesis
from tests.sim.offload import Offloads
from tests.sim.offload import autorecovery_config as offload_config
from tests.sim.producers import Producers
from tests.sim.workload import SHAPES, Workload
from tests.sim.world import Switches, World

WORKLOAD_LIMIT = 300.0  # virtual seconds for the faulty phase; beyond it the run hung
CHECK_LIMIT = 600.0  # virtual seconds for healing and checking


@dataclass(frozen=True)
class Scale:
    """How big a run of a profile is."""

    bookies: int = 5
    entries: int = 300  # at most, per writer; writers stop when the faults do
    faults: int = 8
    duration: float = 3.0  # virtual seconds of faults
    # The loss profiles: writers write one ledger after another until the plan's bookies are
    # lost and repaired (at most this long), at a gentler pace.
    writing: float | None = None
    pace: float = 0.004  # most seconds between a writer's appends
    log_pace: float = 0.01
    reader_rounds: int = 12
    racks: int = 0  # bookies in this many racks (0: all in the default rack)
    shapes: tuple[tuple[int, int, int], ...] = SHAPES  # the writers' (E, WQ, AQ)


SCALES: dict[str, Scale] = {
    "loss": Scale(bookies=7, faults=10, duration=30.0, writing=90.0, pace=0.1, log_pace=0.2,
                  reader_rounds=40),
    "worker_race": Scale(bookies=7, faults=0, duration=1.0, writing=90.0, pace=0.2,
                         log_pace=0.4, reader_rounds=12),
    # tests.sim.racks: three racks of three, one lost whole. AQ 2 of E 3: with every write set
    # over two racks or more, an acknowledged entry has a copy outside any one rack.
    # tests.sim.offload: the log rolls often and is offloaded while it is written.
    "offload": Scale(bookies=5, faults=10, duration=15.0, log_pace=0.05, reader_rounds=20),
    "racks": Scale(bookies=9, faults=10, duration=30.0, writing=90.0, pace=0.1, log_pace=0.2,
                   reader_rounds=40, racks=3, shapes=((3, 3, 2), (3, 2, 2))),
}  # fmt: skip


@dataclass(frozen=True)
class SimOptions:
    switches: Switches = field(default_factory=Switches)
    profile: str = "mixed"
    journal_less: bool | None = None  # None: the seed decides (about one run in three)
    bookies: int | None = None  # None (each of these): the profile's ``Scale``
    writers: int = 2
    entries: int | None = None
    faults: int | None = None
    duration: float | None = None
    stall_rate: float = 0.005  # per append: a writer pausing for 0.2-1.5 s

    def scale(self) -> Scale:
        scale = SCALES.get(self.profile, Scale())
        given = {
            name: getattr(self, name)
            for name in ("bookies", "entries", "faults", "duration")
            if getattr(self, name) is not None
        }
        return dataclasses.replace(scale, **given)


@dataclass
class Result:
    seed: int
    violations: list[str]
    trace: list[str]
    appends: int = 0
    acknowledged: int = 0
    refused: int = 0  # appends that failed before being sent ("fail")
    unknown: int = 0  # appends that failed after being sent
    gc_ledgers: int = 0  # deleted ledgers the bookies' garbage collection dropped
    gc_logs: int = 0  # entry logs it removed
    gc_moved: int = 0  # live entries its compaction copied
    states_loaded: int = 0  # ledger states the bookies read back from their index
    ledgers: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    repairs: dict[str, int] = field(default_factory=dict)  # autorecovery's work
    producers: dict[str, int] = field(default_factory=dict)  # the producers profile's appends
    offload: dict[str, int] = field(default_factory=dict)  # the offload profile's work and faults
    virtual_seconds: float = 0.0
    journal_less: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        lines = [f"seed {self.seed}: {len(self.violations)} violation(s)"]
        lines += [f"  ! {v}" for v in self.violations]
        lines.append(f"  replay: make sim SEED={self.seed}")
        lines.append("  trace:")
        lines += [f"    {line}" for line in self.trace]
        return "\n".join(lines)


class _TraceHandler(logging.Handler):
    def __init__(self, trace: list[str], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(logging.WARNING)
        self._trace = trace
        self._loop = loop

    def emit(self, record: logging.LogRecord) -> None:
        self._trace.append(
            f"{self._loop.time():9.4f} log {record.name}: {record.getMessage()[:300]}"
        )


def run_seed(seed: int, options: SimOptions | None = None) -> Result:
    options = options or SimOptions()
    loop = SimLoop()
    trace: list[str] = []
    result = Result(seed, [], trace)

    def note(text: str) -> None:
        trace.append(f"{loop.time():9.4f} {text}")

    def on_error(_loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        result.violations.append(f"unhandled: {context.get('message')}: {exc!r}")
        note(f"unhandled: {context.get('message')}: {exc!r}")

    loop.set_exception_handler(on_error)
    handler = _TraceHandler(trace, loop)
    root = logging.getLogger()
    saved = (root.level, root.handlers[:])
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            # A timer less than the clock's microsecond away fires without advancing it.
            warnings.simplefilter("ignore", async_solipsism.ResolutionWarning)
            loop.run_until_complete(_run(seed, options, result, note))
    except async_solipsism.SleepForeverError:
        result.violations.append("I13 hang: every task waits and no timer is due")
    except SpinError as exc:
        result.violations.append(f"I13 {exc}")
    except Exception as exc:
        result.violations.append(f"crash: {exc!r}")
        note(f"crash: {traceback.format_exc()}")
    finally:
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])
        result.virtual_seconds = loop.time()
        _abandon(loop)
    return result


def _abandon(loop: SimLoop) -> None:
    """Close the loop after a failed run without running anything more."""
    for task in asyncio.all_tasks(loop):
        task.cancel()
    with contextlib.suppress(Exception):
        loop.run_until_complete(asyncio.sleep(0))
    loop.close()


async def _run(seed: int, options: SimOptions, result: Result, note: object) -> None:
    assert callable(note)
    rng = random.Random(seed)
    scale = options.scale()
    plan = PLANS.get(options.profile)  # bookies lost for good, autorecovery in the bookies
    offload = options.profile == "offload"
    journal_less = options.journal_less
    if journal_less is None:
        # The loss profiles lose data on purpose; a journal-less crash would lose more. The
        # offload profile's autorecovery must not repair what a crash lost.
        journal_less = False if plan is not None or offload else rng.random() < 0.35
    result.journal_less = journal_less
    autorecovery = None if plan is None else autorecovery_config(rng)
    if offload:
        autorecovery = offload_config(rng)
    world = World(
        seed,
        rng,
        bookies=scale.bookies,
        journal_less=journal_less,
        switches=options.switches,
        trace=note,
        autorecovery=autorecovery,
        racks=scale.racks,
        offload=offload,
    )
    history = History()
    world.net.tap = WireTap(world, history)
    note(
        f"seed {seed}: {scale.bookies} bookies"
        + (f" in {scale.racks} racks" if scale.racks else "")
        + (" without journal" if journal_less else "")
    )
    if world.autorecovery is not None:
        note(f"autorecovery: {world.autorecovery}")
    try:
        for sim in world.bookies.values():
            if not await world.start_bookie(sim):
                history.violations.append(f"{sim.node} did not boot on a fresh disk")
        workload = Workload(
            world,
            history,
            rng,
            options.stall_rate,
            pace=scale.pace,
            log_pace=scale.log_pace,
            shapes=scale.shapes,
        )
        nemesis = Nemesis(world, rng, workload, options.profile, rng.choice((1, 2)))
        now = asyncio.get_running_loop().time()
        until = now + scale.duration
        jobs: list[Coroutine[Any, Any, object]] = []
        if plan is None:
            jobs += [
                workload.writer(f"writer-{i}", scale.entries, rng.choice((1, 4, 16)), until)
                for i in range(options.writers)
            ]
        else:
            workload.finish = asyncio.Event()
            nemesis.data_loss_used = True  # the plan's losses are the run's
            until = now + (scale.writing or scale.duration)
            jobs += [
                workload.writer_series(f"writer-{i}", rng.choice((1, 4, 16)), until)
                for i in range(options.writers)
            ]
        jobs.append(workload.reader("reader-0", rounds=scale.reader_rounds))
        jobs.append(workload.log_writer("logwriter-1", until))
        if rng.random() < 0.7:  # a second writer takes the log over mid-run
            takeover = rng.uniform(0.2, scale.duration)
            jobs.append(workload.log_writer("logwriter-2", until, start=takeover))
        if rng.random() < 0.7:  # operators truncating the log while it is written
            jobs.append(workload.log_retention("retention", until, keep=rng.uniform(0.5, 4.0)))
        if offload:
            workload.roll_bytes = (200, 2000)
            workload.peers += ["offloader-0", "logread-0"]
            jobs += Offloads(world, history, rng).jobs(until)
        if options.profile == "producers":
            producers = Producers(world, history, rng, scale.log_pace, workload.peers)
            jobs += producers.jobs(until)
        jobs.append(nemesis.run(scale.duration, scale.faults))
        if plan is not None:
            jobs.append(Loss(nemesis, plan, random.Random(rng.getrandbits(64))).run())
        try:
            await asyncio.wait_for(asyncio.gather(*jobs), WORKLOAD_LIMIT)
        except TimeoutError:
            history.violations.append(f"I13 the workload did not finish in {WORKLOAD_LIMIT}s")
        note("healing")
        try:
            await asyncio.wait_for(_finish(world, history), CHECK_LIMIT)
        except TimeoutError:
            history.violations.append(f"I13 healing and checking took over {CHECK_LIMIT}s")
        result.faults = dict(nemesis.injected)
    finally:
        await world.close()
    result.violations.extend(world.violations)
    result.gc_ledgers, result.gc_logs, result.gc_moved = (
        world.gc_ledgers,
        world.gc_logs,
        world.gc_moved,
    )
    result.states_loaded = world.states_loaded
    if world.autorecovery is not None:
        repairs = world.repairs
        result.repairs = {
            "fragments": repairs.fragments_replicated,
            "entries": repairs.entries_replicated,
            "ledgers": repairs.ledgers_repaired,
            "recovered": repairs.ledgers_recovered,
            "failures": repairs.repair_failures,
            "elections": repairs.auditor_elections,
            "lost_bookies": len(world.lost),
            **world.restored,
        }
    result.violations.extend(history.violations)
    if history.producer_appends:
        results = [op.result for op in history.producer_appends]
        result.producers = {
            "ok": results.count("ok"),
            "already in": results.count("dup"),
            "unknown": results.count("unknown"),
            "deaths": len(world.net.dead),
        }
    if world.objects is not None:
        result.offload = {**history.offload, **world.objects.failed}
    result.appends = len(history.appends)
    result.acknowledged = sum(1 for a in history.appends if a.result == "ok")
    result.refused = sum(1 for a in history.appends if a.result == "fail")
    result.unknown = sum(1 for a in history.appends if a.result == "unknown")
    result.ledgers = len(history.ledgers)


async def _finish(world: World, history: History) -> None:
    await heal(world)
    await check(world, history)


def run_seeds(
    seeds: Iterable[int], options: SimOptions | None = None, workers: int | None = None
) -> Iterator[Result]:
    """``run_seed`` for each seed, in order, spread over ``workers`` processes (default: one
    per core). A seed's run depends on nothing but the seed, the options and
    ``PYTHONHASHSEED``, which the workers inherit; so each result is the one ``run_seed``
    gives here, and a failing seed replays alone with ``make sim SEED=...``."""
    seeds = list(seeds)
    workers = min(workers or os.cpu_count() or 1, len(seeds))
    if workers <= 1:
        yield from (run_seed(seed, options) for seed in seeds)
        return
    # spawn, not fork: the parent may hold threads (an etcd client's) a fork would copy mid-lock
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        yield from pool.map(run_seed, seeds, repeat(options), chunksize=1)
