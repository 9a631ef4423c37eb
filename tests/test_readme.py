"""The README and the pages it leads a new user through run as written: a reader copying a
page's blocks from top to bottom gets what the page says.

One cluster is started the way the Quickstart starts it (``aiobk standalone``, what ``make run``
runs), on free ports. Then each page is walked from top to bottom, as a reader would walk it:

- an ``export NAME=VALUE`` line of a ``sh`` or ``shell`` block sets NAME for everything after
  it, with the pages' example metadata URI (``make run``'s) swapped for the test cluster's. The
  walk starts without ``AIOBK_METADATA``: a page that uses the cluster before it says how to
  find it fails, and the URI it exports must be the one the standalone printed;
- every other line of those blocks that runs ``aiobk`` runs and must exit 0; ``make`` lines
  and the virtual environment's activation are what CI itself has done, and any other command
  fails the test (a page may not show a command this walk does not run);
- every ``python`` block runs as a script, unchanged, and must exit 0.

Blocks that show a command's synopsis or output, or start servers that run until interrupted
(``make run``), are written as ``text`` and not run.
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
# The pages a new user walks through (the rest of docs/ runs in tests/docs/test_code_blocks.py).
PAGES = [
    README,
    REPO / "docs" / "getting-started.md",
    REPO / "docs" / "benchmarks" / "index.md",
]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELL = {"sh", "shell"}
EXAMPLE_URI = "etcd://127.0.0.1:2379/aiobk"
DONE_BY_CI = {"make", ".", "source"}  # `make setup` / `make test` and activating .venv
README_MAX_LINES = 250


@dataclass
class Block:
    line: int  # of the opening fence
    language: str
    code: str


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    text = page.read_text()
    return [
        Block(text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2))
        for match in BLOCK.finditer(text)
    ]


def shell_lines(block: Block) -> list[tuple[int, list[str]]]:
    """(line number, words) of a shell block's commands, continuations joined, comments and
    blank lines dropped."""
    out = []
    for offset, line in enumerate(block.code.replace("\\\n", " ").splitlines()):
        command = line.split(" #", 1)[0].strip()
        if command and not command.startswith("#"):
            out.append((block.line + offset + 1, shlex.split(command)))
    return out


@dataclass
class Standalone:
    uri: str
    root: Path
    env: dict[str, str]  # without AIOBK_METADATA: a page must export it
    printed: list[str]  # what the standalone printed up to "ready"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    root = tmp_path_factory.mktemp("readme")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("AIOBK_METADATA", "AIOBK_TLS_CA", "AIOBK_TLS_CERT", "AIOBK_TLS_KEY"):
        env.pop(name, None)  # the walk starts where a new user starts
    for _attempt in range(5):  # bounded: the etcd port and the one after it must be free
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "aiobk", "standalone", "--data-dir", str(root / "cluster"),
             "--etcd-port", str(port), "--bookie-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
        )  # fmt: skip
        assert process.stdout is not None
        uri = None
        printed: list[str] = []
        for line in process.stdout:  # bounded by the process: it ends or says ready
            printed.append(line.rstrip("\n"))
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
    try:
        yield Standalone(uri, root, env, printed)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:
                process.kill()
            process.stdout.close()


def _walk(page: Path, standalone: Standalone) -> tuple[int, int]:
    """Run ``page`` top to bottom; (python blocks, aiobk commands) run."""
    name = page.relative_to(REPO)
    env = dict(standalone.env)
    pythons = commands = 0
    for block in blocks(page):
        if block.language == "python":
            assert "AIOBK_METADATA" in env, (
                f"{name} line {block.line}: a python block before AIOBK_METADATA is exported"
            )
            run = subprocess.run(
                [sys.executable, "-c", block.code], env=env, cwd=standalone.root,
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            assert run.returncode == 0, f"{name} block at line {block.line}:\n{run.stderr[-3000:]}"
            pythons += 1
        elif block.language in SHELL:
            for line, words in shell_lines(block):
                program = Path(words[0]).name or words[0]  # "." has no name
                if words[0] == "export":
                    variable, _, value = words[1].partition("=")
                    env[variable] = value.replace(EXAMPLE_URI, standalone.uri)
                    if variable == "AIOBK_METADATA":
                        assert env[variable] == standalone.uri, (
                            f"{name} line {line} exports {value!r}, not the URI `make run` prints"
                        )
                        # The line itself is one `make run` prints, for a user to paste.
                        assert f"export AIOBK_METADATA={standalone.uri}" in standalone.printed, (
                            f"{name} line {line}: `make run` prints no export line to copy"
                        )
                elif program == "aiobk":
                    argv = [sys.executable, "-m", "aiobk"]
                    argv += [word.replace(EXAMPLE_URI, standalone.uri) for word in words[1:]]
                    run = subprocess.run(
                        argv, env=env, cwd=standalone.root, capture_output=True, text=True,
                        timeout=180, check=False, stdin=subprocess.DEVNULL,
                    )  # fmt: skip
                    assert run.returncode == 0, (
                        f"{name} line {line}: {shlex.join(words)}\n{run.stderr[-2000:]}"
                    )
                    commands += 1
                else:
                    assert program in DONE_BY_CI, (
                        f"{name} line {line}: {shlex.join(words)} is not a command this walk "
                        "runs; show it as text, or teach tests/test_readme.py to run it"
                    )
    return pythons, commands


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "page", [page for page in PAGES if page.exists()], ids=lambda page: page.name
)
def test_page_runs_top_to_bottom(standalone: Standalone, page: Path) -> None:
    pythons, commands = _walk(page, standalone)
    if page == README:  # the Quickstart: a first append from Python, then the command line
        assert pythons >= 1, "README.md: no python block ran"
        assert commands >= 2, f"README.md: {commands} aiobk commands ran, fewer than 2"
    else:
        assert pythons + commands >= 1, f"{page} runs nothing"


def test_readme_is_a_front_door() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the guides live in docs/"
    assert (REPO / "docs" / "getting-started.md").exists()
