"""The choice between a compiled module and the pure-Python code it stands for, as its chooser
module makes it at import (``aiobk.extensions.compiled``), checked in each of its three cases."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest


def chosen_after(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, setup: Callable[[], None]
) -> tuple[bool, object]:
    """``module.COMPILED`` and ``module.<name>`` once ``module`` is imported again after
    ``setup``; then the setup is undone and the module imported as it was."""
    setup()
    try:
        again = importlib.reload(module)
        return again.COMPILED, getattr(again, name)
    finally:
        monkeypatch.undo()
        importlib.reload(module)


def check_chooser(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, compiled: object
) -> object:
    """``module`` chooses ``compiled`` for ``name`` when it is built and not told otherwise, and
    the pure code with ``AIOBK_NO_EXTENSIONS=1`` or without the build; returns what it chose
    when told."""

    def unbuilt(module_name: str) -> ModuleType:
        raise ImportError(module_name)

    def without_module() -> None:
        monkeypatch.delenv("AIOBK_NO_EXTENSIONS", raising=False)
        monkeypatch.setattr(importlib, "import_module", unbuilt)

    told, pure = chosen_after(
        monkeypatch, module, name, lambda: monkeypatch.setenv("AIOBK_NO_EXTENSIONS", "1")
    )
    assert not told
    assert pure is not compiled
    assert chosen_after(monkeypatch, module, name, without_module)[0] is False
    built = chosen_after(
        monkeypatch, module, name, lambda: monkeypatch.delenv("AIOBK_NO_EXTENSIONS", False)
    )
    assert built == (True, compiled)
    return pure
