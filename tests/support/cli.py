"""Running the ``aiobk`` console script from tests: piped, or on a pseudo-terminal."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
import tempfile

COMMAND = [sys.executable, "-c", "from aiobk.cli import main; main()"]


def aiobk_sync(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def aiobk_on_terminal(*args: str, answer: bytes = b"") -> tuple[int, str, str]:
    """Run aiobk with stdin and stderr on a pseudo-terminal, typing ``answer``; returns the
    status, stdout and what the terminal showed."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [*COMMAND, *args],
            stdin=slave, stdout=out, stderr=slave, env=env,
        )  # fmt: skip
        os.close(slave)
        os.write(master, answer)
        shown = bytearray()
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has gone
                break
            if not chunk:
                break
            shown += chunk
        os.close(master)
        status = proc.wait(timeout=120)
        out.seek(0)
        return status, out.read().decode(), shown.decode(errors="replace")


async def aiobk(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(aiobk_sync, *args)
