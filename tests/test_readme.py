"""README.md's code runs as written (issue 13): a reader copying any block gets what it says.

One cluster is started the way the README's quickstart starts it (``aiobk standalone``, what
``make run`` runs), on free ports; ``AIOBK_METADATA`` points at it, as the README's snippets
expect (they fall back to ``make run``'s ``etcd://127.0.0.1:2379/aiobk``). Then:

- every ``python`` block runs as a script, unchanged, and must exit 0;
- every line of a ``sh`` block that runs ``aiobk`` runs, with the README's example addresses
  swapped for the test cluster's (its etcd URI, a free port, a temporary data directory), and
  must exit 0; a ``bookie start`` line is started, must print that it serves, and must stop
  cleanly on SIGTERM. ``make`` lines are what CI itself runs.

Blocks that show a command's synopsis (``[--option]`` placeholders) are written as ``text``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiobk.metadata import free_port

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
EXAMPLE_URI = "etcd://127.0.0.1:2379/aiobk"


def blocks(language: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block of ``language``."""
    text = README.read_text()
    out = []
    for match in BLOCK.finditer(text):
        if match.group(1) == language:
            out.append((text.count("\n", 0, match.start()) + 1, match.group(2)))
    return out


def shell_commands() -> list[tuple[int, str]]:
    """``aiobk`` lines of the sh blocks, continuation lines joined, comments dropped."""
    out = []
    for line_number, code in blocks("sh"):
        joined = code.replace("\\\n", " ")
        for offset, line in enumerate(joined.splitlines()):
            command = line.split(" #", 1)[0].strip()
            words = shlex.split(command) if command else []
            if words and Path(words[0]).name == "aiobk":
                out.append((line_number + offset + 1, command))
    return out


@dataclass
class Standalone:
    uri: str
    root: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    root = tmp_path_factory.mktemp("readme")
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


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("line", "code"), blocks("python"), ids=lambda v: str(v)[:20])
def test_python_block_runs_as_written(standalone: Standalone, line: int, code: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=standalone.env, cwd=standalone.root, capture_output=True, text=True, timeout=200,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, f"README.md block at line {line}:\n{run.stderr[-3000:]}"


def _adapted(command: str, standalone: Standalone, port: int) -> list[str]:
    """The README's example addresses swapped for the test cluster's."""
    command = command.replace(EXAMPLE_URI, standalone.uri)
    command = re.sub(r"--port \d+", f"--port {port}", command)
    command = re.sub(r"--data-dir /\S+", f"--data-dir {standalone.root / 'b1'}", command)
    words = shlex.split(command)
    return [sys.executable, "-m", "aiobk", *words[1:]]


@pytest.mark.timeout(240)
def test_shell_commands_run_as_written(standalone: Standalone) -> None:
    commands = shell_commands()
    assert len(commands) >= 3, commands  # the quickstart and the CLI examples
    port = free_port()
    for line, command in commands:
        argv = _adapted(command, standalone, port)
        if argv[3:5] == ["bookie", "start"]:
            _start_and_stop(argv, standalone, line)
            continue
        run = subprocess.run(
            argv, env=standalone.env, cwd=standalone.root, capture_output=True, text=True,
            timeout=120, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert run.returncode == 0, f"README.md line {line}: {command}\n{run.stderr[-2000:]}"


def _start_and_stop(argv: list[str], standalone: Standalone, line: int) -> None:
    process = subprocess.Popen(
        argv, env=standalone.env, cwd=standalone.root, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        first = process.stdout.readline()
        assert "serving on" in first, f"README.md line {line}: {first!r}"
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        assert process.stderr is not None
        process.stderr.close()
