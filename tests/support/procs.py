"""Bookies as real child processes, for kill -9 and restart tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from aiobk.metadata import free_port
from tests.support.wait import wait_until

# Bookies in tests that are not about disks ignore how full this shared host's disk is (other
# tenants fill it: it has been seen with 287 MiB free, and at 87% used a low-water mark of 80%
# kept a test bookie read-only), and set aside no reserve (hundreds of test bookies would hold
# 64 MiB each). The disk tests set their own (tests/bookie/test_disk_full.py, tests/hostile/).
HOST_DISK_SETTINGS = {
    "disk_reserved_space": 0,
    "disk_usage_threshold": 1.0,
    "disk_usage_warn_threshold": 1.0,
    "disk_usage_lwm_threshold": 1.0,
}


def bookie_module(src: str | Path | None) -> str:
    """The ``-m`` name of the bookie in source tree ``src`` (None: this tree): ``aiobk.bookie``,
    or ``bookie`` in a tree from before the single ``aiobk`` namespace."""
    if src is None or (Path(src) / "aiobk" / "bookie").is_dir():
        return "aiobk.bookie"
    return "bookie"


async def stopped(pid: int) -> None:
    """Until every thread of ``pid`` has stopped: a SIGSTOP takes effect a little later, and
    etcd's threads that were running meanwhile have been seen to answer two more requests."""

    def all_stopped() -> bool:
        states = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as handle:
                    stat = handle.read()
            except OSError:
                continue
            states.add(stat[stat.rfind(")") + 2])
        return states <= {"T", "t"}

    await wait_until(all_stopped, timeout=5, every=0.01, what=f"every thread of {pid} stopped")


class BookieProcess:
    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *args: str,
        env: dict[str, str] | None = None,
        module: str = "aiobk.bookie",
    ) -> None:
        """``env`` is added to the child's environment (say, PYTHONPATH to run another tree);
        ``module`` is the bookie's ``-m`` name (``bookie`` in trees from before the ``aiobk``
        namespace, see ``bookie_module``)."""
        self.data_dir = data_dir
        self.port = port or free_port()
        self.args = list(args)
        self.env = env or {}
        self.module = module
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    async def start(self, timeout: float = 30.0) -> None:
        args = list(self.args)
        if "--config" not in args:
            config = self.data_dir.parent / f"{self.data_dir.name}.toml"
            config.write_text("".join(f"{k} = {v!r}\n" for k, v in HOST_DISK_SETTINGS.items()))
            args += ["--config", str(config)]
        cmd = [
            sys.executable,
            "-m",
            self.module,
            "start",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            *args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env
        )
        log.close()
        stdout = self.process.stdout
        assert stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(stdout.readline), timeout)
        if b"serving on" not in line:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(
                f"bookie did not start: {line!r}\n{self.log_path.read_text(errors='replace')}"
            )

    def kill(self) -> None:
        """SIGKILL: no clean-shutdown step runs."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._close_pipe()

    def terminate(self) -> int:
        assert self.process is not None
        self.process.terminate()
        code = self.process.wait(30)
        self._close_pipe()
        return code

    def _close_pipe(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._close_pipe()
