"""What ``import aiobk`` and ``aiobk --version`` show a user: the API and nothing else, the
version, and one name for the records of a log."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import aiobk
import aiobk.client
from aiobk.client import LogPosition, LogRecord


@pytest.mark.timeout(10)
def test_dir_shows_the_api_and_the_version_only() -> None:
    assert dir(aiobk) == sorted([*aiobk.__all__, "__version__"])
    for name in aiobk.__all__:
        assert getattr(aiobk, name) is getattr(aiobk.client, name), name
    assert aiobk.__version__ == importlib.metadata.version("aiobk")
    for private in ("Any", "TYPE_CHECKING", "annotations", "importlib"):
        assert private not in dir(aiobk)
    with pytest.raises(AttributeError, match="has no attribute 'LogEntry'"):
        aiobk.LogEntry  # noqa: B018 - never a public name of the package


@pytest.mark.timeout(10)
def test_records_are_log_records_and_the_old_name_still_works_with_a_warning() -> None:
    record = LogRecord(LogPosition(3, 4), b"x")
    assert repr(record).startswith("LogRecord(position=LogPosition(ledger_id=3, entry_id=4)")
    assert aiobk.LogRecord is LogRecord
    assert "LogEntry" not in aiobk.client.__all__
    with pytest.warns(DeprecationWarning, match="LogEntry is deprecated: the class is LogRecord"):
        from aiobk.client import LogEntry
    assert LogEntry is LogRecord
    assert LogEntry(LogPosition(3, 4), b"x") == record
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert aiobk.client.LogRecord is LogRecord  # the new name does not warn
    with pytest.raises(AttributeError):
        aiobk.client.NoSuchName  # noqa: B018


@pytest.mark.timeout(60)
def test_aiobk_version_prints_the_installed_version() -> None:
    script = str(Path(sys.executable).parent / "aiobk")  # the console script of this venv
    for command in ([script], [sys.executable, "-m", "aiobk"]):
        result = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"aiobk {aiobk.__version__}\n"
