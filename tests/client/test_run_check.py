"""The choice of the compiled READ_RANGE check (client.run_check): made at import, the
compiled module unless ``AIOBK_NO_EXTENSIONS=1`` or it is not built."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest

from aiobk.client import run_check as runs_module

compiled: ModuleType = importlib.import_module("aiobk.protocol._runs")
LEDGER = 7


def _chosen(monkeypatch: pytest.MonkeyPatch, setup: Callable[[], None]) -> tuple[bool, object]:
    """``COMPILED`` and ``check_run`` of the module imported again after ``setup``."""
    setup()
    try:
        module = importlib.reload(runs_module)
        return module.COMPILED, module.check_run
    finally:
        monkeypatch.undo()
        importlib.reload(runs_module)


def test_the_chooser_uses_the_compiled_check_unless_told_or_unable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (runs_module.check_run is compiled.check_run) == runs_module.COMPILED
    told, check = _chosen(monkeypatch, lambda: monkeypatch.setenv("AIOBK_NO_EXTENSIONS", "1"))
    assert not told
    assert check(b"", LEDGER, 0, 0, 0, True) is None  # type: ignore[operator]

    def unbuilt(name: str) -> ModuleType:
        raise ImportError(name)

    def without_module() -> None:
        monkeypatch.delenv("AIOBK_NO_EXTENSIONS", raising=False)
        monkeypatch.setattr(importlib, "import_module", unbuilt)

    assert _chosen(monkeypatch, without_module)[0] is False
    built = _chosen(monkeypatch, lambda: monkeypatch.delenv("AIOBK_NO_EXTENSIONS", False))
    assert built == (True, compiled.check_run)
