"""``aiobk bookies list`` tells a dead bookie from a live one: when each was last heard from
(its registration lease's last refresh), ``late`` once it misses a refresh, and ``lost`` once
its registration is gone while its cookie (or the auditor) still knows it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from aiobk.bookie import Bookie, BookieConfig
from tests.support.cli import aiobk_sync
from tests.support.names import unique_name

TTL = 9.0  # a refresh every 3 s: late after 4.5 s silent, gone after 9 s


async def _listed(uri: str) -> dict[str, dict[str, Any]]:
    result = await asyncio.to_thread(aiobk_sync, "bookies", "list", "--metadata", uri, "--json")
    assert result.returncode == 0, result.stderr
    return {row["id"]: row for row in json.loads(result.stdout)}


@pytest.mark.timeout(90)
async def test_a_killed_bookie_is_late_then_lost_in_bookies_list(
    etcd_server: Any, tmp_path: Path
) -> None:
    uri = etcd_server.uri(unique_name("roster"))
    bookies = [
        Bookie(
            BookieConfig(
                data_dir=str(tmp_path / f"b{i}"), port=0, metadata_uri=uri, registration_ttl=TTL
            )
        )
        for i in range(2)
    ]
    for bookie in bookies:
        await bookie.start()
    survivor, victim = bookies
    try:
        rows = await _listed(uri)
        now_ms = time.time() * 1000
        for bookie in bookies:
            row = rows[bookie.bookie_id]
            assert row["state"] == "writable"
            assert row["registered"] is True
            assert row["late"] is False
            assert now_ms - 6000 <= row["last_heard"] <= now_ms + 1000

        await victim.crash()  # as SIGKILL: the lease is no longer refreshed, nor revoked
        crashed = time.monotonic()
        seen_late = False
        async with asyncio.timeout(60):
            while True:
                row = (await _listed(uri))[victim.bookie_id]
                if row["registered"]:
                    # Still registered in its last state, but no longer looking healthy once
                    # it has missed a refresh.
                    assert row["state"] == "writable"
                    seen_late |= row["late"]
                    await asyncio.sleep(0.3)
                    continue
                break
        assert seen_late, "never listed late while its registration lived on"
        assert time.monotonic() - crashed >= TTL / 3
        assert row["state"] == "lost"
        assert row["address"] == victim.bookie_id  # its cookie's address: host:port
        assert row["last_heard"] is None
        rows = await _listed(uri)
        assert rows[survivor.bookie_id]["late"] is False

        text = await asyncio.to_thread(aiobk_sync, "bookies", "list", "--metadata", uri)
        assert text.returncode == 0, text.stderr
        (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith(victim.bookie_id)]
        assert " lost " in line
        assert "last heard" in text.stdout
    finally:
        await victim.crash()  # a no-op once crashed
        await survivor.stop()
