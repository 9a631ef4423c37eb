"""An S3 server for tests: moto in server mode, a child process on a free loopback port.

No S3 server binary can be installed here, and moto's server speaks the S3 REST API well
enough for what the stores use: multipart uploads (and their listing and abort), ranged GETs,
HEAD, listing, delete. Its ranged GETs copy the whole object each time, so it serves
correctness, not speed. A child process rather than moto's threaded server: its requests do
not compete with the test's event loop for the GIL, and it is killed whole at the end.

Credentials are fake and set in the environment (``S3Server.environ``); so is
``AWS_EC2_METADATA_DISABLED``, so no SDK ever asks 169.254.169.254 for a role.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

REGION = "us-east-1"
# Fake keys: moto accepts any, and real ones must never be near a test.
ENVIRON = {
    "AWS_ACCESS_KEY_ID": "aiobk-test-key",
    "AWS_SECRET_ACCESS_KEY": "aiobk-test-secret",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class S3Server:
    """``python -m moto.server`` on 127.0.0.1, logging to ``log``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def environ(self) -> dict[str, str]:
        """What a store of this server needs in its environment."""
        return dict(ENVIRON)

    def start(self) -> None:
        for _ in range(3):  # another process may take the free port first
            self.port = free_port()
            with self.log.open("ab") as log:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **ENVIRON},
                )
            if self._wait_ready():
                return
            self.stop()
        raise RuntimeError(f"moto server did not start: {self.log.read_text()[-2000:]}")

    def _wait_ready(self) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.endpoint}/", timeout=1):
                    return True
            except OSError:
                time.sleep(0.05)  # a readiness poll: the server says nothing once it listens
        return False

    def make_bucket(self, bucket: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{quote(bucket)}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200, answer.status

    def bucket_url(self, bucket: str, prefix: str = "") -> str:
        """A fresh bucket ``bucket``, and the URL of a store in it under ``prefix``."""
        self.make_bucket(bucket)
        path = f"/{prefix}" if prefix else ""
        return f"s3://{bucket}{path}?endpoint={self.endpoint}&region={REGION}"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = ["ENVIRON", "REGION", "S3Server", "free_port"]
