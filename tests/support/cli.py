"""Running the ``aiobk`` console script from tests: piped, on a pseudo-terminal, or as a child
of the running loop; and what a command's one-line error looks like."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
import tempfile

COMMAND = [sys.executable, "-c", "from aiobk.cli import main; main()"]
CHILD_COMMAND = [sys.executable, "-m", "aiobk"]
# Each command names its cluster: a URI in the environment running the tests reaches none.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "AIOBK_METADATA"}


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


async def aiobk_child(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    """Run ``python -m aiobk`` as a child of the running loop, without ``AIOBK_METADATA``;
    returns the status, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        *CHILD_COMMAND,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=CHILD_ENV,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def one_line_error(code: int, err: str, expected_code: int = 1) -> str:
    """The one line of ``aiobk: error: ...`` a command exiting with ``expected_code`` printed."""
    assert code == expected_code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("aiobk: error: "), err
    return lines[0]
