"""A bookie process under attack: its settings file, its RSS, its counters, its exit code.

The bookie runs as a real process (``tests.support.procs.BookieProcess``) so that its resident set
is its own; ``RssSampler`` reads ``VmRSS`` from ``/proc/PID/status`` in a thread every 50 ms
and keeps the peak. ``src`` runs the bookie from another source tree (PYTHONPATH), which is
how the probes of ``python -m tests.hostile`` and a check against the pre-fix code run the
same attack against old and new code; settings that tree does not know are left out of its
file (it has no such bound) rather than refused.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.hostile.rawclient import bookie_stats
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess, bookie_module

MiB = 1024 * 1024
SAMPLE_INTERVAL = 0.05  # seconds between RSS samples
SRC_ENV = "HOSTILE_BOOKIE_SRC"  # run the tests' bookies from this source tree instead


def rss_bytes(pid: int) -> int:
    """The resident set of ``pid`` now (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


class RssSampler:
    """Samples a process's RSS in a thread; ``peak - baseline`` is what an attack cost.

    ``limit`` (bytes of growth) calls ``on_limit`` once when passed: the probes kill an old
    bookie there rather than let it take the machine."""

    def __init__(
        self,
        pid: int,
        limit: int | None = None,
        on_limit: Callable[[], None] | None = None,
        interval: float = SAMPLE_INTERVAL,
    ) -> None:
        self.pid = pid
        self.baseline = rss_bytes(pid)
        self.peak = self.baseline
        self.last = self.baseline
        self.limit = limit
        self.on_limit = on_limit
        self.limit_hit = False
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    @property
    def growth(self) -> int:
        """Peak growth over the baseline, in bytes."""
        return self.peak - self.baseline

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> int:
        value = rss_bytes(self.pid)
        if value:
            self.last = value
            self.peak = max(self.peak, value)
        if self.limit is not None and not self.limit_hit and self.growth > self.limit:
            self.limit_hit = True
            if self.on_limit is not None:
                self.on_limit()
        return value

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()


def known_settings(src: str | None) -> set[str] | None:
    """The setting names the bookie of source tree ``src`` knows (None: this tree's, all)."""
    if src is None:
        return None
    config = f"{bookie_module(src)}.config"
    code = f"import dataclasses, {config} as c; print(' '.join(f.name for f in dataclasses.fields(c.BookieConfig)))"  # noqa: E501
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, **source_env(src)),
        capture_output=True,
        check=True,
        timeout=30,
    )
    return set(out.stdout.decode().split())


def source_env(src: str | None) -> dict[str, str]:
    """Environment that makes the bookie's ``python -m`` import tree ``src`` (not the working
    dir)."""
    if src is None:
        return {}
    return {"PYTHONPATH": str(src), "PYTHONSAFEPATH": "1"}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string is a JSON string for our values


class BookieUnderTest:
    """One bookie process with a settings file, restartable on the same port and directory."""

    def __init__(
        self,
        root: Path,
        settings: Mapping[str, Any] | None = None,
        *,
        name: str = "bookie",
        src: str | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.data_dir = root / name
        self.config_path = root / f"{name}.toml"
        self.src = src
        self.settings = {**HOST_DISK_SETTINGS, **(settings or {})}
        self.dropped: list[str] = []  # settings the source tree does not know
        self._write_config()
        self.proc = BookieProcess(
            self.data_dir,
            None,
            "--config",
            str(self.config_path),
            *args,
            env=source_env(src),
            module=bookie_module(src),
        )

    def _write_config(self) -> None:
        known = known_settings(self.src)
        lines = [f"data_dir = {toml_value(self.data_dir)}"]
        for key, value in self.settings.items():
            if known is not None and key not in known:
                self.dropped.append(key)
                continue
            lines.append(f"{key} = {toml_value(value)}")
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("\n".join(lines) + "\n")

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self.proc.port

    @property
    def pid(self) -> int:
        assert self.proc.process is not None
        return self.proc.process.pid

    @property
    def alive(self) -> bool:
        return self.proc.process is not None and self.proc.process.poll() is None

    async def start(self, timeout: float = 30.0) -> None:
        await self.proc.start(timeout)

    async def stats(self, timeout: float = 10.0) -> dict[str, int]:
        return await bookie_stats(self.host, self.port, timeout)

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def sampler(
        self, limit: int | None = None, on_limit: Callable[[], None] | None = None
    ) -> RssSampler:
        return RssSampler(self.pid, limit, on_limit)

    def terminate(self) -> int:
        """SIGTERM (a clean stop); the exit code."""
        return self.proc.terminate()

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()

    def kill_now(self) -> None:
        """SIGKILL without waiting (safe from the sampler's thread: an RSS cap was passed)."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Cleanup: whatever state it is in, it is gone afterwards."""
        self.proc.stop()

    def log_text(self) -> str:
        try:
            return self.proc.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def dir_bytes(self, relative: str) -> int:
        """Bytes of the files under ``data_dir/relative``."""
        total = 0
        for path in (self.data_dir / relative).rglob("*"):
            if path.is_file():
                total += path.stat().st_size
        return total


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile (0..1) of ``values``, nearest rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of latencies in seconds, as milliseconds."""
    return {
        "p50_ms": round(statistics.median(values) * 1000, 1) if values else 0.0,
        "p99_ms": round(percentile(values, 0.99) * 1000, 1),
        "max_ms": round(max(values, default=0.0) * 1000, 1),
    }
