"""``aiobk bench add --metadata URI`` (or AIOBK_METADATA) measures an existing cluster: no
servers of its own, its in-flight, durability, entry size and count options honoured, and no
ledger left behind. Its log modes append through a log writer, ``log-producer`` with a producer
id and a sequence per append, and pair each such level with the ``log`` level before it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiobk.bench.add import open_target
from aiobk.client import BookKeeper, Durability
from tests.client.test_logs import take
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


@pytest.mark.timeout(150)
async def test_bench_add_log_modes_alternate_and_are_paired(
    etcd_cluster: Cluster, tmp_path: Path
) -> None:
    report = tmp_path / "add.json"
    env = {**os.environ, "AIOBK_METADATA": etcd_cluster.uri}
    flags = ("--in-flight", "1,4", "--entries", "30", "--entry-size", "64", "--seconds", "60")
    modes = "log,log-producer,log,log-producer"
    run = await asyncio.to_thread(_bench, *flags, "--modes", modes, "--json", str(report), env=env)
    assert run.returncode == 0, run.stderr + run.stdout
    document = json.loads(report.read_text())
    assert document["modes"] == modes.split(",")
    levels = [
        (lv["mode"], lv["in_flight"], lv["appends"], lv["errors"]) for lv in document["levels"]
    ]
    assert levels == [(mode, in_flight, 30, 0) for mode in modes.split(",") for in_flight in (1, 4)]
    pairs = document["producer_pairs"]
    assert [p["in_flight"] for p in pairs] == [1, 4, 1, 4]
    assert all(p["ratio"] > 0 and p["p50_ratio"] > 0 for p in pairs)
    assert document["checks"] == []  # the target is judged at 512 in flight
    assert "log-producer appends/s" in run.stdout
    async with BookKeeper(etcd_cluster.uri) as bk:
        assert [name async for name in bk.list_logs()] == []  # every log it wrote deleted
        assert [i async for i in bk.list_ledgers()] == []


@pytest.mark.timeout(60)
async def test_the_producer_mode_numbers_every_record(etcd_cluster: Cluster) -> None:
    """What ``log-producer`` appends: records of its producer, each with the next sequence;
    ``log`` appends the same records without them. Both remove their log afterwards."""
    async with BookKeeper(etcd_cluster.uri) as bk:
        for mode, expected in (("log-producer", [0, 1, 2]), ("log", [None, None, None])):
            append, remove = await open_target(bk, mode, Durability.PERSISTENT)
            await asyncio.gather(*(append(b"r%d" % i) for i in range(3)))
            (name,) = [name async for name in bk.list_logs()]
            records = await take(await bk.open_log_reader(name), 3)  # the writer still open
            assert [r.data for r in records] == [b"r0", b"r1", b"r2"]
            assert [r.sequence for r in records] == expected
            producer = "bench-producer" if mode == "log-producer" else None
            assert {r.producer_id for r in records} == {producer}
            await remove()
            assert [name async for name in bk.list_logs()] == []
