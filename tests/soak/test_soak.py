"""The short version of `make soak` that runs in `make test`: 75 s of load with every operation
and fault scaled to happen a few times, judged as a long run is, and its report rendered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.soak.report import summary, to_json, write_json
from tests.soak.run import run_soak
from tests.soak.settings import SoakSettings

SECONDS = 75.0


@pytest.mark.timeout(SECONDS + 300)
async def test_short_soak_holds_every_check(tmp_path: Path) -> None:
    settings = SoakSettings.scaled(SECONDS, seed=1)
    result = await run_soak(settings, tmp_path / "run")
    text = summary(result)
    assert result.passed, text + "\n" + "\n".join(result.timeline)
    # The harness did what it is for: load, the reader keeping up, each operation and fault.
    assert result.history.acked > 0.8 * settings.rate * SECONDS, text
    assert result.log_verdict is not None
    assert result.log_verdict.reads >= result.history.acked
    assert result.faults.get("bookie_kills", 0) >= 2, text
    assert result.faults.get("etcd_restarts", 0) >= 1, text
    assert result.faults.get("truncations", 0) >= 3, text
    assert result.truncated_ledgers > 0, text
    assert result.churn.get("deleted", 0) > 10, text
    assert {"writer", "reader", "churn", "bookie0", "etcd0"} <= result.memory.keys()
    assert {"bookie0", "etcd0"} <= result.disk.keys()
    assert len(result.growth) == len(result.memory) + len(result.disk)
    report = tmp_path / "report.json"
    write_json(result, report)
    assert json.loads(report.read_text())["verdict"] == to_json(result)["verdict"] == "pass"
    assert "verdict: PASS" in text
