"""The soak's processes: a multi-member etcd, bookies, and the services (writer, reader, churn).

Everything listens on free loopback ports and keeps its data under one base directory:
``etcd/member<i>`` (each member's data and ``etcd.log``), ``bookie<i>`` (data and journal),
``bookie<i>.log`` and ``bookie<i>.toml`` beside it, and ``<service>.log`` (a service's stderr).
A bookie is SIGKILLed and started again on its own data and port (so under its own id), an etcd
member killed or stopped and started again with its data, as tests/support/procs.py and
aiobk.metadata.etcd_process do for the other real-process tests. None outlives the harness:
etcd members and bookies (``tests.soak.bookie``) get the parent-death signal, the services
stop when their stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiobk.metadata.etcd_process import EtcdCluster
from tests.soak.settings import SoakSettings
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess

ROOT = Path(__file__).resolve().parents[2]  # the repository: services run as tests.soak.*
BOOKIE_START_BOUND = 60.0
BOOKIE_START_ATTEMPTS = 5
SERVICE_READY_BOUND = 120.0
SERVICE_STOP_BOUND = 200.0  # the writer drains its calls in flight and closes (writer.py)
LINE_LIMIT = 64 * 1024 * 1024  # one batch of events from a service catching up

Event = Callable[[str, dict[str, Any]], None]


def child_env() -> dict[str, str]:
    """What a child needs to import tests.soak from any working directory."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


class Service:
    """One service subprocess: events from its stdout handed to ``on_event`` as they come;
    ``stop()`` closes its stdin (the service's signal to finish) and waits for it to exit."""

    def __init__(self, name: str, args: list[str], log_path: Path, on_event: Event) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self.on_event = on_event
        self.process: asyncio.subprocess.Process | None = None
        self.returncode: int | None = None
        self._ready: asyncio.Future[None] | None = None
        self._pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.returncode is None else None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **child_env())
        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", f"tests.soak.{self.name}", *self.args,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                cwd=ROOT, env=env, limit=LINE_LIMIT,
            )  # fmt: skip
        self._pump = loop.create_task(self._read_events())
        waiter = asyncio.ensure_future(asyncio.shield(self._ready))
        done, _ = await asyncio.wait([waiter, self._pump], timeout=SERVICE_READY_BOUND,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        waiter.cancel()
        if not self._ready.done():
            raise RuntimeError(
                f"service {self.name} did not get ready"
                + (" (it exited)" if self._pump in done else "")
                + f"; see {self.log_path}"
            )

    async def _read_events(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        assert self._ready is not None
        while line := await self.process.stdout.readline():
            try:
                event = json.loads(line)
            except ValueError:
                event = {"garbled": line.decode(errors="replace")}
            if "ready" in event and not self._ready.done():
                self._ready.set_result(None)
            self.on_event(self.name, event)
        self.returncode = await self.process.wait()

    async def stop(self, bound: float = SERVICE_STOP_BOUND) -> int | None:
        """Ask it to finish and wait; killed after ``bound`` s. Its exit status (None: it had
        to be killed)."""
        if self.process is None:
            return None
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        assert self._pump is not None
        try:
            async with asyncio.timeout(bound):
                await asyncio.shield(self._pump)
        except TimeoutError:
            self.kill()
            await self._pump
            return None
        return self.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()


class SoakCluster:
    """``settings.etcd_members`` etcd members and ``settings.bookies`` bookie processes."""

    def __init__(self, base: Path, settings: SoakSettings) -> None:
        self.base = base
        self.settings = settings
        self.etcd = EtcdCluster(
            size=settings.etcd_members, data_dir=str(base / "etcd"), extra_args=settings.etcd_args()
        )
        self.bookies: list[BookieProcess] = []
        self.uri = ""

    async def start(self) -> None:
        # Launched from this (the main) thread: each member dies with this process
        # (etcd_process's parent-death signal). Its wait for a leader blocks the loop briefly;
        # nothing else runs yet.
        self.etcd.start()
        self.uri = self.etcd.uri("soak")
        toml = {**HOST_DISK_SETTINGS, **self.settings.bookie_toml()}
        for index in range(self.settings.bookies):
            data = self.base / f"bookie{index}"
            config = self.base / f"bookie{index}.toml"
            config.write_text("".join(f"{key} = {value!r}\n" for key, value in toml.items()))
            args = ("--config", str(config), "--metadata", self.uri)
            bookie = BookieProcess(data, None, *args, env=child_env(), module="tests.soak.bookie")
            self.bookies.append(bookie)
        await asyncio.gather(*(self.start_bookie(index) for index in range(len(self.bookies))))

    async def start_bookie(self, index: int) -> None:
        """Start (again) bookie ``index`` on its data and port; a start that fails (its port
        not yet free, etcd electing a leader) is tried again."""
        bookie = self.bookies[index]
        for attempt in range(BOOKIE_START_ATTEMPTS):
            try:
                await bookie.start(BOOKIE_START_BOUND)
                return
            except (RuntimeError, TimeoutError):
                bookie.stop()
                if attempt == BOOKIE_START_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(2.0)

    async def kill_bookie(self, index: int, hold: float) -> None:
        """SIGKILL, ``hold`` s down, started again on the same data dir and port."""
        self.bookies[index].kill()
        await asyncio.sleep(hold)
        await self.start_bookie(index)

    async def restart_etcd(self, index: int, hold: float, *, crash: bool) -> None:
        """Member ``index`` killed (``crash``) or stopped cleanly, ``hold`` s down, started
        again with its data; returns once the cluster has a leader again."""
        member = self.etcd.members[index]
        if crash:
            await asyncio.to_thread(member.kill)
        else:
            await asyncio.to_thread(member.stop, remove_data=False)
        await asyncio.sleep(hold)
        member.launch()  # from the main thread, see start()
        await asyncio.to_thread(member.wait_ready)
        await asyncio.to_thread(self.etcd.wait_leader)

    def down(self) -> list[str]:
        """The servers not running (when no fault holds one down: those that died)."""
        down = [f"etcd{i}" for i, member in enumerate(self.etcd.members) if not member.running]
        for index, bookie in enumerate(self.bookies):
            if bookie.process is None or bookie.process.poll() is not None:
                down.append(f"bookie{index}")
        return down

    def pids(self) -> dict[str, int]:
        """The pid of each server process running now, by name."""
        pids: dict[str, int] = {}
        for index, member in enumerate(self.etcd.members):
            if member.running and member.pid is not None:
                pids[f"etcd{index}"] = member.pid
        for index, bookie in enumerate(self.bookies):
            process = bookie.process
            if process is not None and process.poll() is None:
                pids[f"bookie{index}"] = process.pid
        return pids

    def directories(self) -> dict[str, Path]:
        dirs = {f"etcd{i}": Path(m.data_dir or "") for i, m in enumerate(self.etcd.members)}
        dirs.update({f"bookie{i}": b.data_dir for i, b in enumerate(self.bookies)})
        return dirs

    def logs(self) -> list[Path]:
        return [Path(m.log_path) for m in self.etcd.members] + [b.log_path for b in self.bookies]

    async def stop(self) -> None:
        """Bookies first (SIGTERM: a clean shutdown), then etcd."""
        for bookie in self.bookies:
            if bookie.process is not None and bookie.process.poll() is None:
                try:
                    await asyncio.to_thread(bookie.terminate)
                except subprocess.TimeoutExpired:
                    bookie.stop()
            else:
                bookie.stop()
        await asyncio.to_thread(self.etcd.stop, remove_data=False)


def rss(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes, from /proc (None: it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def disk_usage(path: Path) -> int:
    """Bytes allocated to the files under ``path``, as ``du`` counts them (files that vanish
    during the walk, as journal files and entry logs do, are skipped)."""
    total = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total
