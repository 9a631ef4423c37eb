"""A short atheris run in `make test` (longer ones: `make fuzz`)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_codec_fuzzing_finds_no_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.codec", "-runs=200000", "-seed=1",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Done 200000 runs" in run.stderr


@pytest.mark.timeout(120)
def test_storage_fuzzing_finds_no_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Index segments, journal records and entry-log records, both ways (what an encoder
    cannot take must never be acknowledged)."""
    run = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.storage", "-runs=30000", "-seed=1",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Done 30000 runs" in run.stderr


@pytest.mark.timeout(120)
def test_offload_object_fuzzing_finds_no_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Offload objects both ways: any ledger reads back and any changed byte is refused; any
    bytes are refused with MalformedObjectError only."""
    run = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.offload", "-runs=30000", "-seed=1",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Done 30000 runs" in run.stderr
