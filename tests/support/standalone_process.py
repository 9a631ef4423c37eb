"""``aiobk standalone`` as a child process with one bookie, its output kept as it comes, and
the etcd it starts found among its children: for the tests of the command and of what its etcd
runs with. ``tests/support/standalone_cluster.py`` starts one for the documentation's snippets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aiobk.metadata.etcd_process import free_port, port_in_use


def free_pair() -> int:
    """A port P with P + 1 free too (etcd's client and peer ports)."""
    for _attempt in range(50):
        port = free_port()
        if port < 65535 and not port_in_use("127.0.0.1", port + 1):
            return port
    raise RuntimeError("no two consecutive free ports after 50 tries")


def holds_within(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition()`` holds within ``seconds``, polled from a thread with no event
    loop (the processes here are watched from plain test functions)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def child_etcd(parent: int) -> int:
    """The etcd process whose parent is ``parent``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        if name == "etcd" and int(fields[1]) == parent and fields[0] not in "ZX":
            return int(entry)
    raise AssertionError(f"process {parent} has no etcd child")


class StandaloneProcess:
    """One ``aiobk standalone`` process with one bookie."""

    def __init__(self, data_dir: Path, etcd_port: int, bookie_port: int) -> None:
        self.uri = f"etcd://127.0.0.1:{etcd_port}/aiobk"
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "aiobk", "standalone", "--bookies", "1",
                "--data-dir", str(data_dir), "--etcd-port", str(etcd_port),
                "--bookie-port", str(bookie_port),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, name="standalone-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # until the process closes its end
            self.output.append(line)

    def wait_for(self, text: str, seconds: float = 60.0) -> None:
        found = holds_within(lambda: any(text in line for line in self.output), seconds)
        assert found, f"no {text!r} in {self.output} (exit status {self.proc.poll()})"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
