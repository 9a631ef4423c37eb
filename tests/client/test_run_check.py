"""The choice of the compiled READ_RANGE check (client.run_check): made at import, the
compiled module unless ``AIOBK_NO_EXTENSIONS=1`` or it is not built."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from aiobk.client import run_check as runs_module
from tests.support.choosers import check_chooser

compiled: ModuleType = importlib.import_module("aiobk.protocol._runs")
LEDGER = 7


def test_the_chooser_uses_the_compiled_check_unless_told_or_unable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (runs_module.check_run is compiled.check_run) == runs_module.COMPILED
    check = check_chooser(monkeypatch, runs_module, "check_run", compiled.check_run)
    assert check(b"", LEDGER, 0, 0, 0, True) is None  # type: ignore[operator]
