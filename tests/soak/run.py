"""One soak run: the cluster and the services started, the operator and the nemesis at work for
``settings.seconds``, then the end (faults stop, the writer stops and drains, the reader catches
up with the last acknowledgement) and the judgement. See the package doc."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiobk.client import BookKeeper, LogPosition
from aiobk.protocol.errors import BKError
from tests.soak.checks import Growth, LogVerdict, check_log, judge_growth
from tests.soak.cluster import Service, SoakCluster, disk_usage, rss
from tests.soak.history import History
from tests.soak.settings import SoakSettings

log = logging.getLogger(__name__)

LOG = "soak"
TRUNCATE_BOUND = 60.0  # one truncate_log call
FAULT_BOUND = 180.0  # one fault, restart included
CATCH_UP_POLL = 0.5
REGISTRY_BOUND = 10.0  # one listing of the registry
# A truncation may fail now and then (an etcd election under it); failing this many times in a
# row, retention has stalled and the log grows without bound: the run fails.
RETENTION_STALLED = 2


@dataclass
class SoakResult:
    settings: SoakSettings
    history: History = field(default_factory=History)
    started: float = 0.0  # wall time of the writer's start (time 0 of every series)
    ended: float = 0.0  # wall time of the writer's stop
    faults: dict[str, int] = field(default_factory=dict)
    truncated_ledgers: int = 0
    churn: dict[str, Any] = field(default_factory=dict)
    service_events: list[str] = field(default_factory=list)  # a writer reopened and the like
    writer_failures: list[tuple[int, str]] = field(default_factory=list)  # (sequence, error)
    memory: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    disk: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the harness's own trouble: fails the run
    log_verdict: LogVerdict | None = None
    growth: list[Growth] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)  # series a window had no sample of
    base: str = ""

    @property
    def failures(self) -> list[str]:
        failures = list(self.errors)
        if self.log_verdict is not None:
            failures += [f"log: {v}" for v in self.log_verdict.violations]
        if self.writer_failures:
            failures.append(
                f"writer failed {len(self.writer_failures)} appends: "
                + "; ".join(grouped(error for _sequence, error in self.writer_failures))
            )
        if self.history.unresolved:
            shown = ", ".join(map(str, self.history.unresolved[:5]))
            failures.append(f"{len(self.history.unresolved)} appends never returned: {shown}")
        failures += [
            f"{g.name} kept growing: {g.earlier_peak / 2**20:.1f} MiB -> "
            f"{g.later_peak / 2**20:.1f} MiB (+{g.growth / 2**20:.1f}, allowed "
            f"{g.allowed / 2**20:.1f})"
            for g in self.growth
            if not g.ok
        ]
        failures += [f"{name}: no sample in a window of the second half" for name in self.unjudged]
        return failures

    @property
    def passed(self) -> bool:
        return not self.failures


async def run_soak(
    settings: SoakSettings,
    base: Path,
    *,
    keep: bool = False,
    finish: asyncio.Event | None = None,
) -> SoakResult:
    """Run the soak under ``base`` (created; its data removed at the end unless ``keep`` or
    the run failed: then the logs stay, and with ``keep`` the data too). ``finish`` set ends
    the load early; the end and the judgement run as after a full run."""
    result = SoakResult(settings, base=str(base))
    base.mkdir(parents=True, exist_ok=True)
    run = _Run(settings, base, result, finish or asyncio.Event())
    try:
        await run.main()
    finally:
        await run.teardown()
        if not keep:
            for path in base.iterdir():
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                elif result.passed:
                    path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                base.rmdir()  # when empty: the run passed
    return result


def grouped(texts: Iterable[str], limit: int = 5) -> list[str]:
    """Repeated texts once each, with their counts (``N x text``), most frequent first."""
    counts = Counter(texts)
    return [f"{n} x {text}" if n > 1 else text for text, n in counts.most_common(limit)]


def record(
    result: SoakResult, name: str, event: dict[str, Any], note: Callable[[str], None]
) -> None:
    """One event from service ``name`` into the result (service.py, writer.py, reader.py)."""
    h = result.history
    for kind, body in event.items():
        if kind == "acked":
            for sequence, ledger, entry, latency, wall in body:
                h.ack(sequence, ledger, entry)
                h.latency(int(max(0.0, wall - result.started) // 60), latency)
        elif kind == "read":
            for sequence, ledger, entry, intact in body:
                h.read(sequence, ledger, entry, intact)
        elif kind == "failed":
            for sequence, generation, error in body:
                h.fail(sequence, error)
                result.writer_failures.append((sequence, f"writer {generation}: {error}"))
        elif kind == "done":
            h.called = body["called"]
            h.unresolved = body["unresolved"]
        elif kind == "churn":
            result.churn = body
        elif kind == "reader_error":
            h.reader_errors.append(f"at {body['position']}: {body['error']}")
            note(f"reader: {body['error']} at {body['position']}; opened again")
        elif kind in ("reopened", "open_failed", "close_failed", "garbled"):
            result.service_events.append(f"{name} {kind}: {body}")
            note(f"{name} {kind}: {body}")


class _Run:
    def __init__(
        self, settings: SoakSettings, base: Path, result: SoakResult, finish: asyncio.Event
    ) -> None:
        self.finish = finish
        self.settings = settings
        self.base = base
        self.result = result
        self.history = result.history
        self.rng = random.Random(settings.seed)
        self.cluster = SoakCluster(base, settings)
        self.services: dict[str, Service] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()
        self.bk: BookKeeper | None = None
        self.retention_failures = 0  # in a row
        self.unregistered: dict[str, float] = {}  # running bookie -> out of the registry since

    # ------------------------------------------------------------------ the run

    async def main(self) -> None:
        s = self.settings
        self.note("starting etcd and bookies")
        await self.cluster.start()
        self.bk = await BookKeeper.connect(self.cluster.uri)
        uri = self.cluster.uri
        await self.service("writer", "--metadata", uri, "--log", LOG, "--rate", str(s.rate),
                           "--record-size", str(s.record_size), "--in-flight", str(s.in_flight),
                           "--roll-bytes", str(s.roll_bytes))  # fmt: skip
        self.result.started = time.time()
        await self.service("reader", "--metadata", uri, "--log", LOG)
        await self.service("churn", "--metadata", uri, "--interval", str(s.churn_interval),
                           "--keep", str(s.churn_keep), "--min-entries", str(s.churn_entries[0]),
                           "--max-entries", str(s.churn_entries[1]), "--seed", str(s.seed),
                           "--record-size", str(s.record_size))  # fmt: skip
        self.note("load started")
        self.tasks = [
            asyncio.create_task(self.sampler()),
            asyncio.create_task(self.every(s.truncate_interval, self.truncate)),
            asyncio.create_task(self.every(s.kill_interval, self.kill_bookie)),
            asyncio.create_task(self.every(s.etcd_interval, self.restart_etcd)),
        ]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, self.result.started + s.seconds - time.time())):
                await self.finish.wait()
                self.note("finishing early")
        self.note("stopping the faults")
        self.stopping.set()
        sampler, *periodic = self.tasks
        await asyncio.gather(*periodic)
        self.result.errors += [
            f"{name} died on its own (see its log)" for name in self.cluster.down()
        ]
        self.note("stopping the writer")
        code = await self.services["writer"].stop()
        self.result.ended = time.time()
        if code != 0:
            self.result.errors.append(f"writer service exited with {code}")
        if self.history.called is None:
            self.result.errors.append("the writer service never reported its end")
        self.note("waiting for the reader to catch up")
        deadline = time.monotonic() + s.catch_up
        while not self.history.caught_up() and time.monotonic() < deadline:
            await asyncio.sleep(CATCH_UP_POLL)
        if not self.history.caught_up():
            self.result.errors.append(
                f"the reader did not reach the last acknowledgement within {s.catch_up:.0f}s "
                f"(read up to {self.history.last_read()}, last acked {self.history.last_ack})"
            )
        for name in ("reader", "churn"):
            code = await self.services[name].stop()
            if code != 0:
                self.result.errors.append(f"{name} service exited with {code}")
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        for name in list(self.unregistered):
            self.absence_ended(name, self.result.ended - self.result.started)
        self.judge()

    async def service(self, name: str, *args: str) -> None:
        service = Service(name, list(args), self.base / f"{name}.log", self.on_event)
        self.services[name] = service
        await service.start()

    def on_event(self, name: str, event: dict[str, Any]) -> None:
        record(self.result, name, event, self.note)

    async def every(self, interval: float, action: Callable[[], Awaitable[None]]) -> None:
        """``action`` every ``interval`` s (jittered by a fifth either way; the first after
        about half of one), until the run stops. One that fails is noted and counted as the
        harness's error: the nemesis must be able to do what it set out to."""
        await self._pause(interval * self.rng.uniform(0.4, 0.6))
        while not self.stopping.is_set():
            try:
                async with asyncio.timeout(FAULT_BOUND):
                    await action()
            except Exception as exc:
                self.result.errors.append(f"{action.__name__}: {exc!r}")
                self.note(f"{action.__name__} failed: {exc!r}")
            await self._pause(interval * self.rng.uniform(0.8, 1.2))

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stopping.wait()

    # ------------------------------------------------------------------ the operator

    async def truncate(self) -> None:
        """Retention: drop the ledgers wholly below the last record the reader has read."""
        assert self.bk is not None
        last = self.history.last_read()
        if last is None:
            return
        try:
            async with asyncio.timeout(TRUNCATE_BOUND):
                removed = await self.bk.truncate_log(LOG, LogPosition(*last))
        except (BKError, TimeoutError) as exc:
            self.count("truncate_failed")
            self.note(f"truncate before {last[0]}:{last[1]} failed: {exc!r}")
            self.retention_failures += 1
            if self.retention_failures == RETENTION_STALLED:
                self.result.errors.append(
                    f"retention stalled: truncate_log failed {RETENTION_STALLED} times in a row "
                    f"by {self.note_time():.0f}s into the run (count: truncate_failed), last: "
                    f"{exc!r}"
                )
            return
        self.retention_failures = 0
        self.count("truncations")
        self.result.truncated_ledgers += len(removed)
        self.note(f"truncated before {last[0]}:{last[1]}: {len(removed)} ledgers")

    # ------------------------------------------------------------------ the nemesis

    async def kill_bookie(self) -> None:
        index = self.rng.randrange(len(self.cluster.bookies))
        hold = self.rng.uniform(*self.settings.kill_hold)
        self.note(f"SIGKILL bookie{index}, back in {hold:.1f}s")
        self.count("bookie_kills")
        await self.cluster.kill_bookie(index, hold)
        self.note(f"bookie{index} restarted")

    async def restart_etcd(self) -> None:
        index = self.rng.randrange(len(self.cluster.etcd.members))
        hold = self.rng.uniform(*self.settings.etcd_hold)
        crash = self.rng.random() < 0.5
        how = "SIGKILL" if crash else "SIGTERM"
        self.note(f"{how} etcd{index}, back in {hold:.1f}s")
        self.count("etcd_restarts")
        await self.cluster.restart_etcd(index, hold, crash=crash)
        self.note(f"etcd{index} back, leader elected")

    # ------------------------------------------------------------------ measuring

    async def sampler(self) -> None:
        while True:
            self.sample()
            await self.check_registry()
            await asyncio.sleep(self.settings.sample_interval)

    async def check_registry(self) -> None:
        """Track each running bookie's absence from the registry: clients place ledgers only
        on registered bookies, so one that runs unregistered shrinks the cluster unseen."""
        assert self.bk is not None
        try:
            async with asyncio.timeout(REGISTRY_BOUND):
                registered = {info.bookie_id for info in await self.bk.store.list_bookies()}
        except (BKError, TimeoutError):
            return  # etcd electing a leader, say: the next sample looks again
        now = self.note_time()
        for index, bookie in enumerate(self.cluster.bookies):
            name = f"bookie{index}"
            running = bookie.process is not None and bookie.process.poll() is None
            if running and f"{bookie.address[0]}:{bookie.port}" not in registered:
                if name not in self.unregistered:
                    self.note(f"{name} is running but not in the registry")
                self.unregistered.setdefault(name, now)
            elif name in self.unregistered:
                self.absence_ended(name, now)

    def absence_ended(self, name: str, now: float) -> None:
        since = self.unregistered.pop(name)
        self.note(f"{name} out of the registry for {now - since:.0f}s")
        if now - since > self.settings.registry_grace:
            self.result.errors.append(
                f"{name} ran outside the registry for {now - since:.0f}s from {since:.0f}s "
                f"into the run (allowed {self.settings.registry_grace:.0f}s): no client could "
                "place a ledger on it"
            )

    def sample(self) -> None:
        now = time.time() - self.result.started
        pids = self.cluster.pids()
        pids.update({name: pid for name, s in self.services.items() if (pid := s.pid)})
        for name, pid in pids.items():
            size = rss(pid)
            if size is not None:
                self.result.memory.setdefault(name, []).append((round(now, 1), size))
        for name, path in self.cluster.directories().items():
            self.result.disk.setdefault(name, []).append((round(now, 1), disk_usage(path)))

    def judge(self) -> None:
        s = self.settings
        self.result.log_verdict = check_log(self.history)
        end = self.result.ended - self.result.started

        def disk_floor(name: str) -> int:
            return s.etcd_disk_growth_floor if name.startswith("etcd") else s.disk_growth_floor

        Series = dict[str, list[tuple[float, int]]]
        judged: list[tuple[str, Series, float, Callable[[str], int]]] = [
            ("memory", self.result.memory, s.memory_growth_share, lambda _: s.memory_growth_floor),
            ("disk", self.result.disk, s.disk_growth_share, disk_floor),
        ]
        for kind, samples_by_name, share, floor in judged:
            for name, samples in samples_by_name.items():
                label = f"{kind} {name}"
                growth = judge_growth(label, samples, 0.0, end, share, floor(name))
                if growth is None:
                    self.result.unjudged.append(label)
                else:
                    self.result.growth.append(growth)

    # ------------------------------------------------------------------ bookkeeping

    def count(self, kind: str) -> None:
        self.result.faults[kind] = self.result.faults.get(kind, 0) + 1

    def note_time(self) -> float:
        """Seconds since the load started (0 before)."""
        return time.time() - self.result.started if self.result.started else 0.0

    def note(self, text: str) -> None:
        self.result.timeline.append(f"{self.note_time():8.1f} {text}")
        log.info("%s", text)

    async def teardown(self) -> None:
        self.stopping.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for service in self.services.values():
            service.kill()
            with contextlib.suppress(Exception):
                await service.stop(10.0)
        if self.bk is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await self.bk.close()
        await self.cluster.stop()
