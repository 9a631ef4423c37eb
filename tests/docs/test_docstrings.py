"""Every public name has a docstring saying what it does: the Python API reference is generated
from them (docs/reference/api.md), so a name without one is a hole in the manual.

Public means: the names in ``__all__`` of ``aiobk``, ``aiobk.client`` (with the error classes
of ``aiobk.client.errors``) and ``aiobk.pipeline``, and ``BOOKIE_USER_FACING`` of
``aiobk.bookie`` (the rest of its ``__all__`` are seams for tests and the simulator). For a
class, its own public methods and properties count too. The main client classes' callables
also name each of their parameters in the docstring.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PACKAGES = ("aiobk", "aiobk.client", "aiobk.pipeline", "aiobk.client.errors")

# The bookie names an application or an operator's script touches; docs/reference/api.md
# renders exactly these (a test below keeps the two equal).
BOOKIE_USER_FACING = (
    "Bookie",
    "BookieAddress",
    "BookieConfig",
    "BookieStats",
    "ConfigError",
    "BookieStateError",
    "CorruptEntryError",
    "IndexCorruptError",
    "JournalCorruptError",
)

# Classes whose every callable names its parameters in its docstring.
PARAMETERS_NAMED = {"BookKeeper", "LedgerHandle", "ReadHandle", "LogPosition", "BookieConfig"}

# Names whose docstrings are still to be written (none now). The test fails once one of them has
# one, so this only shrinks.
UNDOCUMENTED: set[str] = set()


def _own_doc(obj: Any) -> str:
    """The docstring an object has itself (not a base class's, nor a dataclass's signature)."""
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__") or ""
        if doc.startswith(f"{obj.__name__}("):  # what @dataclass writes when there is none
            return ""
        return inspect.cleandoc(doc)
    return inspect.cleandoc(getattr(obj, "__doc__", None) or "")


def _qualname(obj: Any) -> str:
    if inspect.ismodule(obj):
        return obj.__name__
    return f"{obj.__module__}.{obj.__qualname__}"


def public_objects() -> Iterator[tuple[str, Any]]:
    seen: set[int] = set()
    named: list[tuple[str, Any]] = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        named += [(f"{package}.{n}", getattr(module, n)) for n in module.__all__]
    bookie = importlib.import_module("aiobk.bookie")
    named += [(f"aiobk.bookie.{n}", getattr(bookie, n)) for n in BOOKIE_USER_FACING]
    for public_name, obj in named:
        if not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)):
            continue  # constants (ENVELOPE, RAW) are described by their module
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield public_name, obj


def members(cls: type) -> Iterator[tuple[str, Any]]:
    """A class's own public methods and properties."""
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            yield name, value.fget
        elif isinstance(value, classmethod | staticmethod):
            yield name, value.__func__
        elif inspect.isfunction(value):
            yield name, value


def _cases() -> list[tuple[str, Any, str | None]]:
    cases: list[tuple[str, Any, str | None]] = []
    for public_name, obj in public_objects():
        cases.append((public_name, obj, None))
        if inspect.isclass(obj) and _qualname(obj) not in UNDOCUMENTED:
            cases += [(f"{public_name}.{n}", f, obj.__name__) for n, f in members(obj)]
    return cases


CASES = _cases()


@pytest.mark.parametrize(("name", "obj", "owner"), CASES, ids=[c[0] for c in CASES])
def test_public_name_has_a_docstring(name: str, obj: Any, owner: str | None) -> None:
    doc = _own_doc(obj)
    if owner is None and _qualname(obj) in UNDOCUMENTED:
        assert not doc  # checked by the test below as well
        return
    assert len(doc) >= 15, f"{name} ({_qualname(obj)}) has no docstring saying what it does"
    if owner in PARAMETERS_NAMED and inspect.isfunction(obj):
        parameters = [
            p
            for p in inspect.signature(obj).parameters
            if p not in ("self", "cls") and not p.startswith("_")
        ]
        words = set(re.findall(r"\w+", doc))
        missing = [p for p in parameters if p not in words]
        assert not missing, f"{name}: the docstring does not name {', '.join(missing)}"


def test_the_names_still_undocumented_are_listed_and_undocumented() -> None:
    objects = {_qualname(obj): obj for _name, obj in public_objects()}
    for qualname in sorted(UNDOCUMENTED):
        assert qualname in objects, f"{qualname} is no longer public: drop it from UNDOCUMENTED"
        assert not _own_doc(objects[qualname]), (
            f"{qualname} has a docstring now: drop it from UNDOCUMENTED"
        )


def test_the_api_reference_renders_the_user_facing_bookie_names() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "api.md").read_text()
    rendered = re.findall(r"^::: aiobk\.bookie\.(\w+)$", page, flags=re.M)
    assert sorted(rendered) == sorted(BOOKIE_USER_FACING)


def test_every_public_package_name_is_in_the_api_reference() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "api.md").read_text()
    shown = set(re.findall(r"^::: ([\w.]+)$", page, flags=re.M))
    for package in ("aiobk.client", "aiobk.pipeline"):
        module = importlib.import_module(package)
        for name in module.__all__:
            assert f"{package}.{name}" in shown or package in shown, f"{package}.{name}"
