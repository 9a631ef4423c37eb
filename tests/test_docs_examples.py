"""The Spark examples in the README and the documentation are safe to copy: a job never writes
into a log it read (run as written, an example that did appended the log to itself and
doubled it), and a streaming query an example builds is started and stopped, so that a reader
sees how it runs and how it ends. ``tests/test_readme.py`` runs the blocks; this reads them."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_readme import blocks

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])

pytestmark = pytest.mark.timeout(30)


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
            value = args[1]
            found.update(part.strip() for part in str(value).split(",") if value is not None)
    return found


def _outermost_calls(tree: ast.AST) -> Iterator[ast.Call]:
    """Each call that is not itself part of a longer chain."""
    inner: set[int] = set()
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    for call in calls:
        node = call.func
        while isinstance(node, ast.Attribute | ast.Call):
            node = node.value if isinstance(node, ast.Attribute) else node.func
            if isinstance(node, ast.Call):
                inner.add(id(node))
    return (call for call in calls if id(call) not in inner)


def _python_blocks() -> Iterator[tuple[str, str]]:
    for page in PAGES:
        for block in blocks(page):
            if block.language == "python":
                yield f"{page.relative_to(REPO)}:{block.line}", block.code


@pytest.mark.parametrize(
    ("where", "code"), [pytest.param(where, code, id=where) for where, code in _python_blocks()]
)
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


def test_the_walk_finds_the_spark_examples() -> None:
    spark = [where for where, code in _python_blocks() if 'format("aiobk")' in code]
    assert spark, "no Spark example found in the pages"
