"""Bookie processes for the benchmarks: started, awaited and stopped the same way everywhere.

``source`` runs the bookies from another source tree (PYTHONPATH and working directory), which is
how a benchmark compares a tree from before a change with this one on the same machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from aiobk.metadata import free_port


def bookie_module(source: str | None) -> str:
    """The ``-m`` name of the bookie in tree ``source`` (None: this one): ``aiobk.bookie``, or
    ``bookie`` in a tree from before the single ``aiobk`` namespace."""
    if source is None or (Path(source) / "aiobk" / "bookie").is_dir():
        return "aiobk.bookie"
    return "bookie"


def start_bookie(
    data_dir: str,
    uri: str | None = None,
    extra: Sequence[str] = (),
    source: str | None = None,
    port: int | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """One bookie process on ``port`` (a free loopback one by default), returned once it
    serves."""
    port = port or free_port()
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = source
    metadata = ["--metadata", uri] if uri else []
    process = subprocess.Popen(
        [
            sys.executable, "-m", bookie_module(source), "start", "--port", str(port),
            "--data-dir", data_dir, *metadata, *extra,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        env=env, cwd=source or None,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        line = process.stdout.readline()
    except BaseException:  # Ctrl-C while it starts: it is not the caller's to stop yet
        stop_bookies([process])
        raise
    if b"serving on" not in line:
        stop_bookies([process])
        raise RuntimeError(f"a bookie did not start: {line!r}")
    return process, port


def start_bookies(
    count: int,
    base: str,
    uri: str,
    extra: Sequence[str] = (),
    source: str | None = None,
) -> list[subprocess.Popen[bytes]]:
    """``count`` bookies with data under ``base``, registered at ``uri``."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(count):
            data_dir = os.path.join(base, f"bookie{index}")
            procs.append(start_bookie(data_dir, uri, extra, source)[0])
    except BaseException:
        stop_bookies(procs)
        raise
    return procs


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM each one still running, wait up to ``grace`` seconds for each, then SIGKILL
    what is left; close their output pipes."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def stop_bookies(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Bookies get 30 s each to stop cleanly (a checkpoint on the way out)."""
    stop_processes(procs, 30.0)
