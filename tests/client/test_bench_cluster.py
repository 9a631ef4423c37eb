"""``aiobk bench add --metadata URI`` (or AIOBK_METADATA) measures an existing cluster: no
servers of its own, its in-flight, durability, entry size and count options honoured, and no
ledger left behind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiobk.client import BookKeeper
from tests.support.cluster import Cluster


def _bench(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiobk", "bench", "add", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


@pytest.mark.timeout(150)
async def test_bench_add_measures_an_existing_cluster(
    etcd_cluster: Cluster, tmp_path: Path
) -> None:
    report = tmp_path / "add.json"
    env = {**os.environ, "AIOBK_METADATA": etcd_cluster.uri}
    flags = ("--in-flight", "1,4", "--entries", "40", "--entry-size", "7", "--seconds", "60")
    run = await asyncio.to_thread(
        _bench, *flags, "--durability", "volatile", "--json", str(report), env=env
    )
    assert run.returncode == 0, run.stderr + run.stdout
    document = json.loads(report.read_text())
    assert document["modes"] == ["volatile"]
    assert document["entry_size"] == 7
    assert document["floor_us"] is None  # not this machine's disks: no floors, no targets
    assert document["checks"] == []
    levels = [(lv["in_flight"], lv["appends"], lv["mode"]) for lv in document["levels"]]
    assert levels == [(1, 40, "volatile"), (4, 40, "volatile")]
    assert all(lv["errors"] == 0 for lv in document["levels"])
    async with BookKeeper(etcd_cluster.uri) as bk:
        assert [i async for i in bk.list_ledgers()] == []  # every ledger it wrote deleted

    refused = await asyncio.to_thread(
        _bench, "--metadata", etcd_cluster.uri, "--modes", "tls", "--entries", "1", env=env
    )
    assert refused.returncode == 2
    assert "with --metadata use persistent or volatile" in refused.stderr
