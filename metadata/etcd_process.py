"""Run a real etcd server as a child process (standalone clusters and tests).

Loopback only; a temporary or given data directory; stopped with SIGTERM, then SIGKILL.
``stop(remove_data=False)`` then ``start()`` (or ``restart()``) brings the same member back on the
same ports with its data: an etcd outage for tests, as a restart or crash of the real one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field


class EtcdNotFoundError(RuntimeError):
    """The etcd binary is not on PATH (``make setup`` installs it)."""


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, and that this process has not handed out before: the
    kernel may offer a just-released port again, and two bookies given one port would start
    as one identity (seen: the second refused at its cookie)."""
    for _attempt in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no fresh loopback port after 100 tries")


@dataclass
class EtcdProcess:
    """``start()`` launches etcd and waits until it accepts connections."""

    client_port: int = 0
    peer_port: int = 0
    data_dir: str | None = None
    host: str = "127.0.0.1"
    startup_timeout: float = 20.0
    extra_args: tuple[str, ...] = ()  # more etcd flags, e.g. ("--auth-token-ttl=2",)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _own_dir: bool = field(default=False, init=False)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def uri(self, prefix: str = "aiobk") -> str:
        return f"etcd://{self.endpoint}/{prefix}"

    def start(self) -> EtcdProcess:
        binary = shutil.which("etcd")
        if binary is None:
            raise EtcdNotFoundError("etcd is not on PATH; run `make setup` to install etcd-server")
        self.client_port = self.client_port or free_port(self.host)
        self.peer_port = self.peer_port or free_port(self.host)
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="aiobk-etcd-")
            self._own_dir = True
        client = f"http://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        os.makedirs(self.data_dir, exist_ok=True)
        log_path = os.path.join(self.data_dir, "etcd.log")
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [
                    binary,
                    "--name=aiobk",
                    f"--data-dir={os.path.join(self.data_dir, 'member-data')}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=aiobk={peer}",
                    "--log-level=error",
                    *self.extra_args,
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {log_path}")
            try:
                with socket.create_connection((self.host, self.client_port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd did not start within {self.startup_timeout}s; see {log_path}")

    def stop(self, remove_data: bool = True) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
        if remove_data and self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self) -> EtcdProcess:
        """Stop (keeping the data) and start again on the same ports and data directory."""
        self.stop(remove_data=False)
        return self.start()
