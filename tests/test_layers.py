"""The structure the layers promise: no import cycle among the modules of any layer,
and the bookie never reaches the client. ``make lint`` checks the order between layers
(import-linter, ``[tool.importlinter]`` in pyproject.toml); this checks inside each one.

Imports under ``TYPE_CHECKING`` count: a cycle that only the type checker sees is still two
modules that cannot be understood one without the other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import grimp
import pytest

from tests.test_packaging import _copy_checkout

LAYERS = ("protocol", "metadata", "tiered", "bookie", "client", "autorecovery", "pipeline", "bench")


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("aiobk", cache_dir=None)


def import_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module among ``package``'s modules
    (Tarjan's algorithm), each sorted."""
    inside = {m for m in graph.modules if m == package or m.startswith(package + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module) & inside:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(inside) + 100))
    try:
        for module in sorted(inside):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(cycles)


@pytest.mark.parametrize("layer", LAYERS)
def test_no_import_cycle_inside_a_layer(layer: str) -> None:
    assert import_cycles(_graph(), f"aiobk.{layer}") == []


def test_the_bookie_never_reaches_the_client() -> None:
    """Not even through another module: the repairer is handed in by the wiring (aiobk/).
    ``python -m aiobk.bookie`` (``bookie/__main__.py``) is an entry point into the wiring, the
    one declared exception (as in the import-linter contracts)."""
    graph = _graph()
    graph.remove_module("aiobk.bookie.__main__")
    chains = graph.find_shortest_chains(
        importer="aiobk.bookie", imported="aiobk.client", as_packages=True
    )
    assert not chains, sorted(" -> ".join(chain) for chain in chains)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c", "p.d"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    graph.add_import(importer="p.d", imported="p.a")
    assert import_cycles(graph, "p") == [["p.a", "p.b", "p.c"]]


@pytest.mark.timeout(120)
def test_the_layer_contracts_catch_wrong_way_imports(tmp_path: Path) -> None:
    """``make lint`` fails on a wrong-way import: in a copy of the checkout, the bookie imports
    the client and the protocol imports click; lint-imports must name both."""
    _copy_checkout(tmp_path)
    storage = tmp_path / "bookie" / "storage.py"
    storage.write_text(storage.read_text() + "\nfrom aiobk.client import BookKeeper  # noqa\n")
    codec = tmp_path / "protocol" / "codec.py"
    codec.write_text(codec.read_text() + "\nimport click  # noqa\n")
    lint = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [str(lint), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode != 0, result.stdout
    assert "aiobk.bookie.storage -> aiobk.client" in result.stdout
    assert "aiobk.protocol.codec -> click" in result.stdout
    assert "Contracts: 0 kept, 2 broken." in result.stdout
