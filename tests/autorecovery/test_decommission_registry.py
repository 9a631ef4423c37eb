"""After ``aiobk bookies decommission`` a bookie is gone from the registry: ``aiobk
bookies list`` no longer shows it, whether it was stopped by its operator when the command said
so, or had crashed with its registration still held by a lease that had not run out. The
commands run as users run them (child processes), against real bookies in process (their own
autorecovery doing the copying) on a real etcd."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess
from tests.autorecovery.helpers import assert_copies, ledgers_naming
from tests.autorecovery.watching import key_until
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name

# The auditor never calls a stopped bookie lost within a test: what moves is the drain's doing.
SETTINGS = {
    # A crashed bookie stays registered a while: long enough for the test to list it with a
    # child process first (3 s was not, once, on a loaded machine: the CLI took longer to start).
    "registration_ttl": 10.0,
    "lost_bookie_recovery_delay": 60.0,
    "autorecovery_lease_ttl": 2.0,
    "autorecovery_poll_interval": 0.2,
    "rereplication_retry_delay": 0.2,
}
ENV = {k: v for k, v in os.environ.items() if k != "AIOBK_METADATA"}
COMMAND = [sys.executable, "-m", "aiobk"]


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("decomlist"))
    cluster = await start_cluster(tmp_path, 4, uri=uri, **SETTINGS)
    yield cluster
    await cluster.stop()


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *COMMAND, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV
    )


async def _listed(uri: str) -> list[dict[str, Any]]:
    proc = await _spawn("bookies", "list", "--json", "--metadata", uri)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


async def _closed(bk: BookKeeper) -> int:
    lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
    for i in range(10):
        await lh.append(b"entry %d" % i)
    await lh.close()
    return lh.ledger_id


@pytest.mark.timeout(60)
async def test_a_crashed_bookie_still_registered_is_gone_from_the_list_after(
    cluster: Cluster,
) -> None:
    uri = cluster.uri
    async with BookKeeper(uri) as bk:
        store = bk.store
        ids = [await _closed(bk) for _ in range(3)]
        victim_id = (await store.read_ledger(ids[0])).fragments[0].ensemble[0]
        await key_until(store, store.keys.auditor, lambda v: v is not None, 20)
        victim = cluster.by_id(victim_id)
        cluster.bookies.remove(victim)
        await victim.crash()  # its registration lives on until its lease runs out
        assert victim_id in {row["id"] for row in await _listed(uri)}
        proc = await _spawn(
            "bookies", "decommission", victim_id, "--metadata", uri,
            "--timeout", "30", "--poll-interval", "0.2", "--json",
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 45)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err.decode()
        result = json.loads(out)
        assert (result["bookie_id"], result["cookie_removed"]) == (victim_id, True)
        assert victim_id not in {row["id"] for row in await _listed(uri)}
        assert victim_id not in {b.bookie_id for b in await store.list_bookies()}
        assert await ledgers_naming(store, victim_id) == []
        assert await store.read_cookie(victim_id) is None
        for ledger_id in ids:
            await assert_copies(bk, ledger_id)


@pytest.mark.timeout(60)
async def test_a_live_bookie_stopped_when_told_is_gone_from_the_list_after(
    cluster: Cluster,
) -> None:
    uri = cluster.uri
    async with BookKeeper(uri) as bk:
        store = bk.store
        ids = [await _closed(bk) for _ in range(3)]
        victim_id = (await store.read_ledger(ids[0])).fragments[0].ensemble[1]
        await key_until(store, store.keys.auditor, lambda v: v is not None, 20)
        proc = await _spawn(
            "bookies", "decommission", victim_id, "--metadata", uri,
            "--timeout", "30", "--poll-interval", "0.2",
        )  # fmt: skip
        assert proc.stderr is not None
        shown: list[str] = []
        try:
            async with asyncio.timeout(40):
                while not any("Stop the bookie process now" in line for line in shown):
                    line = (await proc.stderr.readline()).decode()
                    assert line, "".join(shown)  # the command ended before saying so
                    shown.append(line)
            listed = {row["id"]: row["state"] for row in await _listed(uri)}
            assert listed[victim_id] == "readonly"  # drained, still running, read-only
            victim = cluster.by_id(victim_id)
            cluster.bookies.remove(victim)
            await victim.stop()
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, "".join(shown) + err.decode()
        assert out.decode().startswith(f"bookie {victim_id} decommissioned")
        assert victim_id not in {row["id"] for row in await _listed(uri)}
        assert await store.read_cookie(victim_id) is None
        for ledger_id in ids:
            await assert_copies(bk, ledger_id)
