"""A cluster started the way a reader starts one: ``aiobk standalone`` (what ``make run`` runs)
on free ports, for tests that run documentation as written (README.md, docs/).

``AIOBK_METADATA`` in ``Standalone.env`` points at it, as the documented snippets expect (they
fall back to ``make run``'s ``etcd://127.0.0.1:2379/aiobk``).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aiobk.metadata import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_URI = "etcd://127.0.0.1:2379/aiobk"


@dataclass
class Standalone:
    uri: str
    root: Path
    env: dict[str, str]


@contextmanager
def standalone_cluster(root: Path) -> Iterator[Standalone]:
    """``aiobk standalone`` under ``root`` until the block ends, then stopped with SIGINT (it
    must exit 0)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for _attempt in range(5):  # bounded: the etcd port and the one after it must be free
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "aiobk", "standalone", "--data-dir", str(root / "cluster"),
             "--etcd-port", str(port), "--bookie-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
        )  # fmt: skip
        assert process.stdout is not None
        uri = None
        for line in process.stdout:  # bounded by the process: it ends or says ready
            if line.startswith("metadata: "):
                uri = line.split(": ", 1)[1].strip()
            if "ready" in line:
                break
        if uri is not None and process.poll() is None:
            break
        process.kill()
        process.wait(30)
        process.stdout.close()  # a try that failed: its pipe is not left to the collector
    else:
        raise AssertionError("aiobk standalone did not start in 5 tries")
    env["AIOBK_METADATA"] = uri
    try:
        yield Standalone(uri, root, env)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:
                process.kill()
            process.stdout.close()


def adapted(command: str, cluster: Standalone, port: int) -> list[str]:
    """A documented ``aiobk`` command line with the example addresses swapped for the test
    cluster's (its etcd URI, a free port, a temporary data directory), run with this venv's
    interpreter."""
    command = command.replace(EXAMPLE_URI, cluster.uri)
    command = re.sub(r"--port \d+", f"--port {port}", command)
    command = re.sub(r"--data-dir /\S+", f"--data-dir {cluster.root / 'b1'}", command)
    command = re.sub(r"--journal-dir /\S+", f"--journal-dir {cluster.root / 'j1'}", command)
    words = shlex.split(command)
    return [sys.executable, "-m", "aiobk", *words[1:]]


def start_and_stop(argv: list[str], cluster: Standalone, where: str) -> None:
    """Start a documented ``bookie start``: it must say it serves, and stop cleanly on
    SIGTERM."""
    process = subprocess.Popen(
        argv, env=cluster.env, cwd=cluster.root, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        first = process.stdout.readline()
        assert "serving on" in first, f"{where}: {first!r}"
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        assert process.stderr is not None
        process.stderr.close()
