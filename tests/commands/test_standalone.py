"""``aiobk standalone`` as real processes: a second one on busy ports fails at once
with one line naming the port and registers nothing in the first one's cluster (never "ready"
against the other etcd); ``kill -9`` of a standalone takes its etcd along (an orphan would be
silently reused by the next ``make run``); a start and a SIGINT stop still work."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiobk.metadata import open_store
from aiobk.metadata.etcd_process import exited, free_port, port_in_use
from tests.support.standalone_process import (
    StandaloneProcess,
    child_etcd,
    free_pair,
    holds_within,
)


def _bookies(uri: str) -> list[str]:
    async def listing() -> list[str]:
        async with open_store(uri, timeout=5.0) as store:
            return sorted(info.bookie_id for info in await store.list_bookies())

    return asyncio.run(listing())


@pytest.fixture
def standalones() -> Iterator[list[StandaloneProcess]]:
    started: list[StandaloneProcess] = []
    yield started
    for standalone in reversed(started):
        standalone.close()


@pytest.mark.timeout(120)
def test_a_second_standalone_on_busy_ports_fails_fast_and_joins_nothing(
    tmp_path: Path, standalones: list[StandaloneProcess]
) -> None:
    etcd_port, bookie_port = free_pair(), free_port()
    first = StandaloneProcess(tmp_path / "first", etcd_port, bookie_port)
    standalones.append(first)
    first.wait_for("ready")

    second = StandaloneProcess(tmp_path / "second", etcd_port, free_port())
    standalones.append(second)
    started = time.monotonic()
    exited = holds_within(lambda: second.proc.poll() is not None, 20)
    elapsed = time.monotonic() - started
    registered = _bookies(first.uri)  # while the second one runs, if it does
    assert second.proc.stderr is not None
    error = second.proc.stderr.read() if exited else ""
    second.close()
    assert registered == [f"127.0.0.1:{bookie_port}"]  # the first one's bookie, no other
    assert exited, "the second standalone kept running"
    assert elapsed < 10
    assert second.proc.returncode == 1
    assert error.strip().splitlines() == [
        f"aiobk: error: etcd client port 127.0.0.1:{etcd_port} is in use "
        "(another etcd or standalone running?)"
    ]
    busy_bookie = subprocess.run(
        [
            sys.executable, "-m", "aiobk", "standalone", "--bookies", "1",
            "--data-dir", str(tmp_path / "fourth"), "--etcd-port", str(free_pair()),
            "--bookie-port", str(bookie_port),
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert busy_bookie.returncode == 1
    lines = busy_bookie.stderr.strip().splitlines()
    assert len(lines) == 1, busy_bookie.stderr
    assert f"bookie port 127.0.0.1:{bookie_port} is in use" in lines[0]
    assert _bookies(first.uri) == [f"127.0.0.1:{bookie_port}"]


@pytest.mark.timeout(120)
def test_sigkill_of_a_standalone_takes_its_etcd_along(
    tmp_path: Path, standalones: list[StandaloneProcess]
) -> None:
    etcd_port, bookie_port = free_pair(), free_port()
    killed = StandaloneProcess(tmp_path / "data", etcd_port, bookie_port)
    standalones.append(killed)
    killed.wait_for("ready")
    etcd_pid = child_etcd(killed.proc.pid)
    try:
        killed.proc.kill()
        killed.proc.wait(10)
        assert holds_within(lambda: exited(etcd_pid), 10), (
            f"etcd {etcd_pid} outlived its standalone"
        )

        # The next start on the same ports and directory runs an etcd of its own, and a
        # SIGINT stops everything.
        restarted = StandaloneProcess(tmp_path / "data", etcd_port, bookie_port)
        standalones.append(restarted)
        restarted.wait_for("ready")
        own_etcd = child_etcd(restarted.proc.pid)
        assert own_etcd != etcd_pid
        assert _bookies(restarted.uri) == [f"127.0.0.1:{bookie_port}"]
        restarted.proc.send_signal(signal.SIGINT)
        assert restarted.proc.wait(30) == 0
        restarted.wait_for("standalone cluster stopped", 5)
        assert holds_within(lambda: exited(own_etcd), 10)
    finally:
        if not exited(etcd_pid):  # a failing run leaves an orphan for the test to clean up
            os.kill(etcd_pid, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_the_printed_export_line_points_a_shell_at_the_cluster(
    tmp_path: Path, standalones: list[StandaloneProcess]
) -> None:
    etcd_port, bookie_port = free_pair(), free_port()
    standalone = StandaloneProcess(tmp_path / "data", etcd_port, bookie_port)
    standalones.append(standalone)
    standalone.wait_for("ready")
    exports = [line.strip() for line in standalone.output if line.startswith("export ")]
    assert exports == [f"export AIOBK_METADATA={standalone.uri}"]
    # The line as a user pastes it into a new shell, then a command that needs the URI.
    env = {k: v for k, v in os.environ.items() if k != "AIOBK_METADATA"}
    shell = subprocess.run(
        ["bash", "-c", f'{exports[0]}\n"$0" -m aiobk bookies list --json', sys.executable],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert shell.returncode == 0, shell.stderr
    assert f"127.0.0.1:{bookie_port}" in shell.stdout


@pytest.mark.timeout(120)
def test_a_standalone_whose_etcd_dies_says_so_and_exits(
    tmp_path: Path, standalones: list[StandaloneProcess]
) -> None:
    etcd_port, bookie_port = free_pair(), free_port()
    standalone = StandaloneProcess(tmp_path / "data", etcd_port, bookie_port)
    standalones.append(standalone)
    standalone.wait_for("ready")
    etcd_pid = child_etcd(standalone.proc.pid)
    os.kill(etcd_pid, signal.SIGTERM)
    assert holds_within(lambda: standalone.proc.poll() is not None, 30), "it kept running"
    assert standalone.proc.returncode == 1
    assert standalone.proc.stderr is not None
    errors = standalone.proc.stderr.read().splitlines()
    said = [line for line in errors if "etcd" in line and "stopping the bookies" in line]
    assert said == [
        f"aiobk: error: etcd (pid {etcd_pid}) was killed by SIGTERM; stopping the bookies "
        f"(etcd's log: {tmp_path / 'data' / 'etcd' / 'etcd.log'})"
    ], errors
    # Not a stream of warnings about the store: while etcd shuts down, before its process is
    # gone, each component may say once or twice that the store failed it, and then it stops.
    warned = Counter(line.split()[3] for line in errors if " WARNING " in line)
    assert all(times <= 2 for times in warned.values()), errors
    assert len(errors) <= 1 + sum(warned.values()) <= 12, errors
    standalone.wait_for("standalone cluster stopped", 5)
    assert not port_in_use("127.0.0.1", bookie_port)  # its bookies stopped
