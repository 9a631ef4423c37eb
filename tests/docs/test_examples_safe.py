"""The examples of the README and the documentation are safe to copy, beyond running (which
``tests/docs/test_code_blocks.py`` and ``tests/test_readme.py`` check):

- a Spark job never writes into a log it read (run as written, such a job appends the log to
  itself and doubles it), and a streaming query an example builds is started and stopped, so
  that a reader sees how it runs and how it ends;
- a log's records are stamped in order: ``log_position_at_time`` assumes stamps never decrease
  along a log, so an example never appends an explicit stamp after a record stamped by the
  writer's clock (now);
- the README's ``make setup`` line names every system package the Makefile installs."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md", *(p for p in (REPO / "docs").rglob("*.md") if "hooks" not in p.parts)]
)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)

pytestmark = pytest.mark.timeout(30)


def _python_blocks() -> Iterator[tuple[str, str]]:
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == "python":
                line = text.count("\n", 0, match.start()) + 1
                yield f"{page.relative_to(REPO)}:{line}", match.group(2)


BLOCKS = [pytest.param(where, code, id=where) for where, code in _python_blocks()]


def _chain(node: ast.expr) -> list[tuple[str, list[object]]]:
    """``a.b(x).c.d(y)`` as [("b", [x]), ("c", []), ("d", [y])], constants only."""
    steps: list[tuple[str, list[object]]] = []
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
            steps.append((node.func.attr, args))
            node = node.func.value
        elif isinstance(node, ast.Attribute):
            steps.append((node.attr, []))
            node = node.value
        else:
            return steps[::-1]


def _logs(steps: list[tuple[str, list[object]]]) -> set[str]:
    found: set[str] = set()
    for name, args in steps:
        if name == "option" and len(args) == 2 and args[0] in ("log", "logs"):
            found.update(part.strip() for part in str(args[1]).split(","))
    return found


def _outermost_calls(tree: ast.AST) -> Iterator[ast.Call]:
    """Each call that is not itself part of a longer chain."""
    inner: set[int] = set()
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    for call in calls:
        node: ast.expr = call.func
        while isinstance(node, ast.Attribute | ast.Call):
            node = node.value if isinstance(node, ast.Attribute) else node.func
            if isinstance(node, ast.Call):
                inner.add(id(node))
    return (call for call in calls if id(call) not in inner)


@pytest.mark.parametrize(("where", "code"), BLOCKS)
def test_a_spark_example_never_writes_into_a_log_it_read(where: str, code: str) -> None:
    read: set[str] = set()
    written: set[str] = set()
    streams = 0
    for call in _outermost_calls(ast.parse(code)):
        steps = _chain(call)
        names = [name for name, _args in steps]
        if ("format", ["aiobk"]) not in steps:
            continue
        if "write" in names and "save" in names:
            written |= _logs(steps)
        elif "read" in names or "readStream" in names:
            read |= _logs(steps)
            streams += "readStream" in names
    assert not read & written, f"{where}: writes into {sorted(read & written)}, which it read"
    if streams:
        assert ".start()" in code, f"{where}: a streaming query built but never started"
        assert ".stop()" in code or "awaitTermination" in code, (
            f"{where}: a streaming query started but never shown to stop"
        )


@pytest.mark.parametrize(("where", "code"), BLOCKS)
def test_an_example_stamps_a_logs_records_in_order(where: str, code: str) -> None:
    appends = sorted(
        (
            (node.lineno, node.col_offset, node)
            for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and isinstance(node.func.value, ast.Name)
        ),
        key=lambda found: found[:2],
    )
    stamped_now: set[str] = set()  # writers that appended a record stamped by their clock
    for line, _col, call in appends:
        assert isinstance(call.func, ast.Attribute)
        assert isinstance(call.func.value, ast.Name)
        writer = call.func.value.id
        if any(keyword.arg == "timestamp" for keyword in call.keywords):
            assert writer not in stamped_now, (
                f"{where}: line {line} of the block stamps a record after one {writer} stamped "
                "now; give explicit stamps first, in order"
            )
        else:
            stamped_now.add(writer)


def test_the_walks_find_the_examples() -> None:
    codes = [code for _where, code in _python_blocks()]
    assert any('format("aiobk")' in code for code in codes), "no Spark example found"
    assert any("timestamp=" in code for code in codes), "no example with explicit stamps"


# What the README calls each Debian package of `make setup`.
README_NAMES = {"etcd-server": "etcd", "openjdk-17-jre-headless": "Java"}


def test_the_readme_setup_line_names_what_make_setup_installs() -> None:
    makefile = (REPO / "Makefile").read_text()
    packages = re.findall(r'need="\$\$need ([\w.+-]+)"', makefile)
    assert len(packages) >= 3, packages
    # The Quickstart's, the first: what a new user reads before running it.
    line = next(
        line for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("make setup")
    )  # fmt: skip
    missing = [p for p in packages if README_NAMES.get(p, p) not in line]
    assert not missing, f"README's setup line leaves out {missing}: {line!r}"
