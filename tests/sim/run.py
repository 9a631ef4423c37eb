"""One simulated run from one seed: build the world, run writers, readers and the nemesis
together, heal, check. Everything happens on a virtual-time loop (async-solipsism): a timer an
hour away costs nothing, and a run with nothing left to do but wait fails as a hang.

Replaying a seed reproduces the run exactly, given the same ``PYTHONHASHSEED`` (set iteration
order depends on it; ``make sim`` and ``make test`` both pin it to 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import random
import traceback
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat

import async_solipsism

from tests.sim.checker import check, heal
from tests.sim.history import History, WireTap
from tests.sim.loop import SimLoop, SpinError
from tests.sim.nemesis import Nemesis
from tests.sim.workload import Workload
from tests.sim.world import Switches, World

WORKLOAD_LIMIT = 300.0  # virtual seconds for the faulty phase; beyond it the run hung
CHECK_LIMIT = 600.0  # virtual seconds for healing and checking


@dataclass(frozen=True)
class SimOptions:
    switches: Switches = field(default_factory=Switches)
    profile: str = "mixed"
    journal_less: bool | None = None  # None: the seed decides (about one run in three)
    bookies: int = 5
    writers: int = 2
    entries: int = 300  # at most, per writer; writers stop when the faults do
    faults: int = 8
    duration: float = 3.0  # virtual seconds of faults
    stall_rate: float = 0.005  # per append: a writer pausing for 0.2-1.5 s


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
    journal_less = options.journal_less
    if journal_less is None:
        journal_less = rng.random() < 0.35
    result.journal_less = journal_less
    world = World(
        seed,
        rng,
        bookies=options.bookies,
        journal_less=journal_less,
        switches=options.switches,
        trace=note,
    )
    history = History()
    world.net.tap = WireTap(world, history)
    note(f"seed {seed}: {options.bookies} bookies" + (" without journal" if journal_less else ""))
    try:
        for sim in world.bookies.values():
            if not await world.start_bookie(sim):
                history.violations.append(f"{sim.node} did not boot on a fresh disk")
        workload = Workload(world, history, rng, options.stall_rate)
        nemesis = Nemesis(world, rng, workload, options.profile, rng.choice((1, 2)))
        until = asyncio.get_running_loop().time() + options.duration
        jobs = [
            workload.writer(f"writer-{i}", options.entries, rng.choice((1, 4, 16)), until)
            for i in range(options.writers)
        ]
        jobs.append(workload.reader("reader-0", rounds=12))
        jobs.append(workload.log_writer("logwriter-1", until))
        if rng.random() < 0.7:  # a second writer takes the log over mid-run
            takeover = rng.uniform(0.2, options.duration)
            jobs.append(workload.log_writer("logwriter-2", until, start=takeover))
        jobs.append(nemesis.run(options.duration, options.faults))
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
    result.violations.extend(history.violations)
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
