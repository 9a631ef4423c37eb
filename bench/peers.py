"""aiobk against the peers a Python user would pick for a durable append log.

One run, every server started and stopped by the benchmark on loopback, data on the project's
disk: aiobk (etcd + 3 bookie processes, E3 WQ3 AQ2; persistent and volatile, BP-14; persistent
again with AIOBK_NO_EXTENSIONS=1 in a child process, for the compiled code's CPU), NATS
JetStream (3 servers, a file stream with 3 replicas), etcd with 3 members and with 1, Redis with
appendfsync always. One Python asyncio client process (this one, uvloop) appends 1 KiB payloads
through each system's own client: closed loop at each in-flight level for a fixed time, then
open loop at fixed offered rates with latency from each append's intended send time. The
machine's floors are measured first. Prints the tables and the targets as ratios,
writes JSON and a PNG of the latency CDFs.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

import click
import uvloop
from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from aiobk.bench.add import Floors, measure_floors
from aiobk.bench.floors import (
    loopback_rtt_floor,
    own_cpu_seconds,
    process_cpu_split,
    quorum_fdatasync_floor,
)
from aiobk.bench.loops import LoopResult, closed_loop, open_loop
from aiobk.bench.peer_systems import PURE, SYSTEM_KEYS, SYSTEMS, Deployment, System, versions
from aiobk.bench.targets import (
    fail_on_miss_option,
    json_option,
    load_options,
    module_main,
    positive_numbers,
    report_checks,
    write_report,
)
from aiobk.bookie import record_codecs
from aiobk.protocol import add_codecs

# Client + servers CPU microseconds per append of aiobk persistent at 512 in flight before the
# work on the append path's CPU: the median of three `aiobk bench peers` runs (294, 298, 328 us)
# with the client and bookie of commit 1508214. The target is at most half of it.
CPU_BASELINE_US = 298.0
CDF_PERCENTILES = (
    0.1, 1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97, 98, 99, 99.5, 99.7, 99.9, 99.95,
    99.99,
)  # fmt: skip
SHARE_TICKS = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)  # the plot's y axis
WARM_UP_SECONDS = 1.0  # per system, at the highest level, before the first measured one
SETTLE_SECONDS = 1.0  # a pause before each level, after a sync (``settle``)
# The quorum floor is measured again just before and just after each system's 1-in-flight
# level (``floor_beside``): at most these many rounds a side, and at most a third of a level's
# seconds (3 s at most).
BESIDE_QUORUM_ROUNDS = 500
BESIDE_RTT_ROUNDS = 1000


Cpu = tuple[float, float, float]  # CPU seconds: client, servers, servers' system time (``_cpu``)


@dataclass(frozen=True)
class Settings:
    seconds: float
    entry_size: int
    levels: list[int]
    rates: list[float]
    rate_of_nats: list[float]
    systems: list[str]

    @property
    def cap(self) -> int:
        """Appends outstanding at most in an open loop: the highest closed-loop level."""
        return max(self.levels)

    @property
    def drain(self) -> float:
        """How long an open-loop level waits for its last appends before cutting them off."""
        return max(5.0, self.seconds)


@dataclass
class Run:
    """One level of one system (closed loop: ``in_flight``; open: ``offered_per_s``)."""

    system: str
    loop: str  # "closed" or "open"
    in_flight: int  # the level; in an open loop the cap on outstanding appends
    ops: int
    seconds: float
    ops_per_s: float
    p50_us: int
    p99_us: int
    p999_us: int
    max_us: int
    errors: int
    cpu_client_us: float  # CPU microseconds per append: this process
    cpu_servers_us: float  # ... and the system's server processes together
    offered_per_s: float = 0.0
    rate_of_nats: float = 0.0  # the offered rate as a share of NATS's maximum (0: given)
    unfinished: int = 0
    send_lag_p50_us: int = 0
    send_lag_p99_us: int = 0
    cdf: list[tuple[float, int]] = field(default_factory=list)  # (percentile, us)
    # 1 in flight: the quorum floor measured just before and after this level (0: not measured)
    quorum_floor_us: int = 0
    cpu_servers_system_us: float = 0.0  # the kernel's part of cpu_servers_us (system time)

    @property
    def cpu_us(self) -> float:
        return self.cpu_client_us + self.cpu_servers_us


def summarize(
    system: str, loop: str, in_flight: int, result: LoopResult, cpu: Cpu,
    offered: float = 0.0, rate_of_nats: float = 0.0,
) -> Run:  # fmt: skip
    latency = result.latency
    per_op = 1e6 / result.ops if result.ops else 0.0
    values = latency.get_percentile_to_value_dict(list(CDF_PERCENTILES))
    return Run(
        system, loop, in_flight, result.ops, round(result.seconds, 3),
        round(result.ops_per_s, 1), latency.get_value_at_percentile(50),
        latency.get_value_at_percentile(99), latency.get_value_at_percentile(99.9),
        latency.get_max_value(), result.errors, round(cpu[0] * per_op, 1),
        round(cpu[1] * per_op, 1), offered, rate_of_nats, result.unfinished,
        result.send_lag.get_value_at_percentile(50), result.send_lag.get_value_at_percentile(99),
        [(p, values[p]) for p in CDF_PERCENTILES] if result.ops else [],
        cpu_servers_system_us=round(cpu[2] * per_op, 1),
    )  # fmt: skip


def _cpu(pids: list[int]) -> Cpu:
    """CPU seconds so far: this process (every thread), the servers (and their reaped
    children: Redis forks to rewrite its append-only file), and of that the servers' system
    time."""
    split = [process_cpu_split(pid, children=True) for pid in pids]
    return own_cpu_seconds(), sum(map(sum, split)), sum(system for _user, system in split)


def _spent(before: Cpu, after: Cpu) -> Cpu:
    return after[0] - before[0], after[1] - before[1], after[2] - before[2]


Tick = Callable[[str], Callable[[float], None]]


def open_rates(settings: Settings, nats_max: float) -> list[tuple[float, float]]:
    """The open-loop levels: (offered appends/s, its share of NATS's maximum or 0)."""
    rates = [(rate, 0.0) for rate in settings.rates]
    if nats_max > 0:
        rates += [(max(1.0, round(share * nats_max)), share) for share in settings.rate_of_nats]
    return rates


def floor_beside(directory: str, seconds: float) -> tuple[HdrHistogram, HdrHistogram]:
    """A short quorum floor (2nd of 3 concurrent append + fdatasync) and loopback round trip,
    on ``directory``'s disk, taking at most about ``seconds``."""
    quorum = quorum_fdatasync_floor(directory, 3, 2, BESIDE_QUORUM_ROUNDS, seconds * 2 / 3)
    return quorum, loopback_rtt_floor(BESIDE_RTT_ROUNDS, seconds / 3)


def _merged_floor(
    before: tuple[HdrHistogram, HdrHistogram], after: tuple[HdrHistogram, HdrHistogram]
) -> int:
    """The quorum floor (p50 microseconds) of two ``floor_beside`` samples together (merged
    into ``before``'s histograms)."""
    quorum, rtt = before
    quorum.add(after[0])
    rtt.add(after[1])
    return int(quorum.get_value_at_percentile(50) + rtt.get_value_at_percentile(50))


async def drive(
    system: System,
    deployment: Deployment,
    settings: Settings,
    nats_max: float,
    progress: Tick,
    directory: str,
) -> list[Run]:
    """Every level of one system on its running servers: a warm-up, the closed-loop levels,
    then the open-loop rates. ``nats_max``: NATS's most appends/s in this run (NATS itself
    takes it from its own closed loop, run just before). The 1-in-flight level has the quorum
    floor measured just before and just after it, on ``directory``'s disk: a disk whose
    fdatasync drifts by 1.5x within minutes (this machine's) would otherwise judge that level
    against the disk of another minute (the floors at the run's start)."""
    client, pids = deployment.client, deployment.pids
    payload = os.urandom(settings.entry_size)
    runs: list[Run] = []
    try:
        await client.open(settings.cap)
        async with client.target("warm") as append:
            warm_up = min(WARM_UP_SECONDS, settings.seconds)
            tick = progress(f"{system.key} warm-up")
            await closed_loop(append, payload, settings.cap, warm_up, tick)
        for level in settings.levels:
            await settle()
            beside = min(3.0, settings.seconds / 3)
            floor = await asyncio.to_thread(floor_beside, directory, beside) if level == 1 else None
            async with client.target(f"closed{level}") as append:
                tick = progress(f"{system.key} {level} in flight")
                before = _cpu(pids)
                result = await closed_loop(append, payload, level, settings.seconds, tick)
                after = _cpu(pids)
            cpu = _spent(before, after)
            run = summarize(system.key, "closed", level, result, cpu)
            if floor is not None:
                later = await asyncio.to_thread(floor_beside, directory, beside)
                run.quorum_floor_us = _merged_floor(floor, later)
            runs.append(run)
        if system.key == "nats":
            nats_max = max(run.ops_per_s for run in runs)
        for rate, share in open_rates(settings, nats_max):
            await settle()
            async with client.target(f"open{round(rate)}") as append:
                tick = progress(f"{system.key} {rate:.0f}/s offered")
                before = _cpu(pids)
                result = await open_loop(
                    append, payload, rate, settings.seconds, settings.cap, settings.drain, tick
                )
                after = _cpu(pids)
            cpu = _spent(before, after)
            runs.append(summarize(system.key, "open", settings.cap, result, cpu, rate, share))
    finally:
        await client.close()
    return runs


def child_runs(system: System, settings: Settings, base: str) -> list[Run]:
    """``system``'s closed-loop levels, measured by ``aiobk bench peers --systems
    aiobk-persistent`` run as a child with ``system.child_env`` (its own floors, etcd and
    bookies, which inherit the environment), its figures relabelled as ``system``'s."""
    directory = os.path.join(base, system.key)
    os.makedirs(directory)
    path = os.path.join(directory, "runs.json")
    command = [
        sys.executable, "-m", "aiobk", "bench", "peers", "--systems", "aiobk-persistent",
        "--seconds", repr(settings.seconds), "--entry-size", str(settings.entry_size),
        "--in-flight", ",".join(map(str, settings.levels)), "--rates", "", "--rate-of-nats", "",
        "--json", path, "--plot", os.path.join(directory, "cdf.png"),
    ]  # fmt: skip
    # Every level, a warm-up, the floors and the servers' start and stop, with room to spare.
    timeout = (len(settings.levels) + 1) * (settings.seconds + 10) + 180
    done = subprocess.run(
        command, cwd=directory, env={**os.environ, **dict(system.child_env)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{system.key}: the child benchmark exited {done.returncode}: {last}")
    with open(path, encoding="utf-8") as file:
        report = json.load(file)
    if dict(system.child_env).get("AIOBK_NO_EXTENSIONS") == "1" and report["compiled"]:
        raise RuntimeError(f"{system.key}: the child benchmark ran the compiled modules")
    return [
        Run(**{**run, "system": system.key, "cdf": [tuple(point) for point in run["cdf"]]})
        for run in report["runs"]
        if run["loop"] == "closed"
    ]


async def settle() -> None:
    """Before each level, for every system alike: write back what the levels before left dirty
    in the page cache (``sync``) and pause. A level then measures itself, not the writeback of
    the saturating level before it -- the warm-up, another system's run (aiobk persistent's
    open-loop p99 at 1,000/s, the first open level: 81 ms without, 22 ms with;
    bench/README.md)."""
    await asyncio.to_thread(os.sync)
    await asyncio.sleep(SETTLE_SECONDS)


def _interrupted(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM unwinds as Ctrl-C does, stopping every server: it becomes a SIGINT, which
    asyncio's runner turns into a cancellation of the running system's task (an exception
    raised here instead could land in a transport callback, which would only close that
    connection) and which outside a loop raises KeyboardInterrupt."""
    signal.raise_signal(signal.SIGINT)


def measure(settings: Settings, console: Console) -> tuple[Floors, list[Run]]:
    """The floors, then each chosen system on servers of its own, started and stopped here."""
    base = tempfile.mkdtemp(prefix="aiobk-bench-", dir=os.getcwd())
    previous = signal.signal(signal.SIGTERM, _interrupted)
    # SIGTERM becomes a SIGINT, and a SIGINT ignored since the start (a process started in the
    # background, or by one that ignores it) would swallow both: Ctrl-C's handler it is.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    runs: list[Run] = []
    try:
        with console.status("measuring the floors"):
            floors = measure_floors(base)
        with Progress(console=console, transient=True) as bar:

            def progress(name: str) -> Callable[[float], None]:
                task = bar.add_task(name, total=1.0)
                shown = [True]

                def tick(fraction: float) -> None:
                    if shown[0]:
                        bar.update(task, completed=fraction)
                    if fraction >= 1.0 and shown[0]:
                        shown[0] = False
                        bar.remove_task(task)

                return tick

            for system in SYSTEMS:
                if system.key not in settings.systems:
                    continue
                if system.child_env:
                    with console.status(f"{system.title}: in a child benchmark"):
                        runs += child_runs(system, settings, base)
                    console.print(f"{system.title}: done")
                    continue
                nats_max = max((r.ops_per_s for r in runs if r.system == "nats"), default=0.0)
                with system.deploy(os.path.join(base, system.key)) as deployment:
                    runs += uvloop.run(
                        drive(system, deployment, settings, nats_max, progress, base)
                    )
                console.print(f"{system.title}: done")
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        shutil.rmtree(base, ignore_errors=True)
    return floors, runs


# ---------------------------------------------------------------------- targets


def check_targets(
    floors: Floors, runs: list[Run], baseline_cpu_us: float = CPU_BASELINE_US
) -> list[dict[str, Any]]:
    """The targets as ratios of figures from the same run; a target whose figures
    were not measured (levels or systems left out) is not checked."""
    closed = {(r.system, r.in_flight): r for r in runs if r.loop == "closed"}
    checks: list[dict[str, Any]] = []

    def ratio(target: str, numerator: float, denominator: float, limit: float, at_least: bool,
              **detail: Any) -> None:  # fmt: skip
        value = numerator / denominator if denominator else math.inf
        passed = value >= limit if at_least else value <= limit
        checks.append({"target": target, "ratio": round(value, 2), **detail, "pass": passed})

    persistent, volatile, nats, etcd3, pure = (
        {level: closed[(key, level)] for key, level in closed if key == name}
        for name in ("aiobk-persistent", "aiobk-volatile", "nats", "etcd-3", PURE)
    )
    if 512 in persistent and 512 in nats:
        ratio("512 in flight: aiobk persistent >= 3x NATS JetStream R3 appends/s",
              persistent[512].ops_per_s, nats[512].ops_per_s, 3.0, True)  # fmt: skip
    if 512 in persistent and 512 in etcd3:
        ratio("512 in flight: aiobk persistent >= 8x etcd 3-member puts/s",
              persistent[512].ops_per_s, etcd3[512].ops_per_s, 8.0, True)  # fmt: skip
    if 512 in volatile and 512 in nats:
        ratio("512 in flight: aiobk volatile >= 3x NATS JetStream R3 appends/s",
              volatile[512].ops_per_s, nats[512].ops_per_s, 3.0, True)  # fmt: skip
    if 1 in persistent:
        floor = persistent[1].quorum_floor_us or floors.quorum_floor_us  # beside it if measured
        ratio("1 in flight: aiobk persistent p50 <= 1.5x quorum floor",
              persistent[1].p50_us, floor, 1.5, False, p50_us=persistent[1].p50_us,
              quorum_floor_us=floor, run_start_quorum_floor_us=floors.quorum_floor_us)  # fmt: skip
    if 1 in persistent and 1 in nats:
        ratio("1 in flight: aiobk persistent p50 <= NATS p50 (it does not fsync)",
              persistent[1].p50_us, nats[1].p50_us, 1.0, False)  # fmt: skip
    if 1 in volatile and 1 in nats:
        ratio("1 in flight: aiobk volatile p50 <= 0.8x NATS p50",
              volatile[1].p50_us, nats[1].p50_us, 0.8, False)  # fmt: skip
    opened = {(r.system, r.rate_of_nats): r for r in runs if r.loop == "open" and r.rate_of_nats}
    for (key, share), ours in sorted(opened.items()):
        theirs = opened.get(("nats", share))
        if key == "aiobk-persistent" and theirs is not None:
            ratio(f"open loop at {share:g}x NATS's maximum ({ours.offered_per_s:.0f}/s): "
                  "aiobk persistent p99 <= NATS p99", ours.p99_us, theirs.p99_us, 1.0, False,
                  p99_us=ours.p99_us, nats_p99_us=theirs.p99_us)  # fmt: skip
    if 512 in persistent and 512 in pure:
        ratio("512 in flight: aiobk persistent CPU per append <= 0.5x with "
              "AIOBK_NO_EXTENSIONS=1 (client and bookies)", persistent[512].cpu_us,
              pure[512].cpu_us, 0.5, False, cpu_us=round(persistent[512].cpu_us, 1),
              pure_cpu_us=round(pure[512].cpu_us, 1))  # fmt: skip
    if 512 in persistent and baseline_cpu_us > 0:
        ratio(f"512 in flight: aiobk persistent CPU per append <= 0.5x the baseline "
              f"({baseline_cpu_us:g} us)", persistent[512].cpu_us, baseline_cpu_us, 0.5, False,
              cpu_us=round(persistent[512].cpu_us, 1))  # fmt: skip
    return checks


# ---------------------------------------------------------------------- output


def _titles() -> dict[str, System]:
    return {system.key: system for system in SYSTEMS}


def print_tables(console: Console, floors: Floors, runs: list[Run], settings: Settings) -> None:
    systems = _titles()
    closed = Table(
        title=f"closed loop: {settings.entry_size} B appends, {settings.seconds:g} s per level "
        f"(floor {floors.floor_us} us = fdatasync {floors.fdatasync_us} + RTT "
        f"{floors.loopback_rtt_us}; quorum floor {floors.quorum_floor_us} us = 2nd of 3 "
        f"concurrent fdatasyncs {floors.quorum_fdatasync_us} + RTT, at the run's start; a "
        "1-in-flight level is judged against the same floor measured just before and after it)"
    )
    for column in (
        "system", "replicated", "fsync before ack", "in flight", "appends/s", "x NATS",
        "p50 us", "p99 us", "p99.9 us", "p50 / quorum floor", "CPU us/append: client",
        "servers", "of which system", "total", "errors",
    ):  # fmt: skip
        closed.add_column(column, justify="left" if column == "system" else "right",
                          no_wrap=column == "system")  # fmt: skip
    nats = {r.in_flight: r for r in runs if r.system == "nats" and r.loop == "closed"}
    previous = ""
    for r in (r for r in runs if r.loop == "closed"):
        system = systems[r.system]
        versus = nats.get(r.in_flight)
        first = r.system != previous  # the system's traits on its first row only
        previous = r.system
        closed.add_row(
            system.title if first else "", system.replicated if first else "",
            system.fsync if first else "", str(r.in_flight),
            f"{r.ops_per_s:.0f}", f"{r.ops_per_s / versus.ops_per_s:.2f}" if versus and
            versus.ops_per_s else "-", str(r.p50_us), str(r.p99_us), str(r.p999_us),
            f"{r.p50_us / (r.quorum_floor_us or floors.quorum_floor_us):.2f}",
            f"{r.cpu_client_us:.0f}",
            f"{r.cpu_servers_us:.0f}", f"{r.cpu_servers_system_us:.0f}", f"{r.cpu_us:.0f}",
            f"{r.errors}" + (f" +{r.unfinished} cut off" if r.unfinished else ""),
        )  # fmt: skip
    console.print(closed)
    opened = [r for r in runs if r.loop == "open"]
    if not opened:
        return
    table = Table(
        title=f"open loop: latency from each append's intended send time, at most "
        f"{settings.cap} outstanding, cut off {settings.drain:g} s after the last send"
    )
    for column in (
        "system", "offered/s", "achieved/s", "p50 us", "p99 us", "p99.9 us", "max us",
        "p99 x NATS", "send lag p99 us", "unfinished", "errors",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column == "system" else "right",
                         no_wrap=column == "system")  # fmt: skip
    nats_open = {r.offered_per_s: r for r in opened if r.system == "nats"}
    for r in opened:
        versus = nats_open.get(r.offered_per_s)
        share = f" ({r.rate_of_nats:g}x NATS)" if r.rate_of_nats else ""
        offered = f"{r.offered_per_s:.0f}{share}"
        table.add_row(
            systems[r.system].title, offered, f"{r.ops_per_s:.0f}", str(r.p50_us),
            str(r.p99_us), str(r.p999_us), str(r.max_us),
            f"{r.p99_us / versus.p99_us:.2f}" if versus and versus.p99_us else "-",
            str(r.send_lag_p99_us), str(r.unfinished), str(r.errors),
        )  # fmt: skip
    console.print(table)


def plot(report: dict[str, Any], path: str) -> None:
    """Latency CDFs, one panel per closed-loop level and open-loop rate, a line per system
    (latency on a log axis; the cumulative share on a logit axis, which spreads both the
    median and the tail)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import NullFormatter

    runs = [Run(**{**run, "cdf": [tuple(p) for p in run["cdf"]]}) for run in report["runs"]]
    panels: list[tuple[str, list[Run]]] = []
    for level in report["settings"]["levels"]:
        chosen = [r for r in runs if r.loop == "closed" and r.in_flight == level]
        panels.append((f"closed loop, {level} in flight", chosen))
    for rate in dict.fromkeys(r.offered_per_s for r in runs if r.loop == "open"):
        chosen = [r for r in runs if r.loop == "open" and r.offered_per_s == rate]
        share = f" ({chosen[0].rate_of_nats:g}x NATS max)" if chosen[0].rate_of_nats else ""
        panels.append((f"open loop, {rate:.0f}/s{share}, from intended time", chosen))
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure, axes = pyplot.subplots(rows, columns, figsize=(6.4 * columns, 4.8 * rows),
                                   squeeze=False)  # fmt: skip
    colours = {key: f"C{index}" for index, key in enumerate(SYSTEM_KEYS)}
    titles = _titles()
    floors = report["floors"]
    for ax, (name, chosen) in zip(axes.flat, panels, strict=False):
        for r in chosen:
            if r.cdf:
                ax.plot([us / 1000 for _, us in r.cdf], [p / 100 for p, _ in r.cdf],
                        label=titles[r.system].title, color=colours[r.system])  # fmt: skip
        ax.axvline(floors["quorum_floor_us"] / 1000, color="grey", linestyle="--",
                   label="quorum floor")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("logit")
        ax.set_ylim(0.001, 0.9999)
        ax.set_yticks(SHARE_TICKS, [f"{100 * tick:g}%" for tick in SHARE_TICKS])
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("latency, ms")
        ax.set_ylabel("share of appends at or below")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small", loc="upper left")
    figure.suptitle(
        f"aiobk bench peers: {report['settings']['entry_size']} B appends, one asyncio client "
        f"process; fdatasync p50 {floors['fdatasync_p50_us']} us, loopback RTT "
        f"{floors['loopback_rtt_p50_us']} us"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


# ---------------------------------------------------------------------- command line


def _systems(_ctx: click.Context | None, _param: click.Parameter | None, value: str) -> list[str]:
    chosen = [part.strip() for part in value.split(",") if part.strip()]
    unknown = set(chosen) - set(SYSTEM_KEYS)
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown system(s) {', '.join(sorted(unknown)) or value!r}; "
            f"choose from {','.join(SYSTEM_KEYS)}"
        )
    return chosen


@click.command(
    "peers", help=__doc__, short_help="aiobk against NATS JetStream, etcd and Redis, one run."
)
@load_options("1,64,512", "appends")
@click.option(
    "--rates", default="2000,5000", show_default=True, callback=positive_numbers(float, "rates"),
    help="Open loop: comma list of offered appends/s, each for --seconds ('' for none).",
)  # fmt: skip
@click.option(
    "--rate-of-nats",
    default="0.5",
    show_default=True,
    callback=positive_numbers(float, "shares"),
    help="Open loop: more offered rates, as shares of the most appends/s NATS gave in the "
    "closed loop of this run ('' for none).",
)
@click.option(
    "--systems", default=",".join(SYSTEM_KEYS), show_default=True, callback=_systems,
    help="Comma list of the systems to run.",
)  # fmt: skip
@json_option("peers")
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
    help="Latency CDF plot, PNG (default: the result file's name with .png).",
)  # fmt: skip
@fail_on_miss_option()
def command(
    seconds: float,
    entry_size: int,
    levels: list[int],
    rates: list[float],
    rate_of_nats: list[float],
    systems: list[str],
    json_path: str | None,
    plot_path: str | None,
    fail_on_miss: bool,
) -> int:
    if rate_of_nats and "nats" not in systems:
        raise click.BadParameter("needs nats among --systems", param_hint="--rate-of-nats")
    settings = Settings(seconds, entry_size, levels, rates, rate_of_nats, systems)
    console = Console(width=200)
    floors, runs = measure(settings, console)
    print_tables(console, floors, runs, settings)
    checks = check_targets(floors, runs)
    report = {
        "settings": asdict(settings),
        "versions": versions(),
        "floors": {
            "fdatasync_p50_us": floors.fdatasync_us,
            "loopback_rtt_p50_us": floors.loopback_rtt_us,
            "quorum_fdatasync_p50_us": floors.quorum_fdatasync_us,
            "floor_us": floors.floor_us,
            "quorum_floor_us": floors.quorum_floor_us,
        },
        "systems": [
            {"key": s.key, "title": s.title, "replicated": s.replicated, "fsync": s.fsync}
            for s in SYSTEMS
            if s.key in systems
        ],
        "cpu_baseline_us": CPU_BASELINE_US,
        "compiled": add_codecs.COMPILED and record_codecs.COMPILED,  # this process and its bookies
        "runs": [asdict(run) for run in runs],
        "checks": checks,
    }
    path = write_report("peers", report, json_path)
    image = plot_path or os.path.splitext(path)[0] + ".png"
    os.makedirs(os.path.dirname(image) or ".", exist_ok=True)
    plot(report, image)
    console.print(f"wrote {path} and {image}")
    return report_checks(console, checks, fail_on_miss)


main = module_main(command, "peers")


if __name__ == "__main__":
    main()
