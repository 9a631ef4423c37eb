"""``aiobk log offload`` killed by SIGKILL at points of an offload (``AIOBK_TEST_OFFLOAD_PAUSE``
stops the child there, and it says so on stderr): nothing of the log is lost; the work-list
upkeep and the sweep leave the store holding exactly what metadata names, with no unfinished
upload; a second run completes, and the log then reads back whole with every bookie stopped.
On a directory store and on S3 (moto)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest

from aiobk.client import BookKeeper
from aiobk.client.offload import sweep, upkeep
from aiobk.commands.offload import PAUSE_ENV
from aiobk.metadata import OffloadState
from aiobk.protocol.offload_object import DEFAULT_BLOCK_SIZE
from tests.commands.test_offload import canonical, held, named, small, store_url, tail, write_log
from tests.support.cli import CHILD_COMMAND, aiobk
from tests.support.cluster import Cluster

__all__ = ["store_url"]  # the fixture, shared with test_offload

POINTS = ["copying", "uploading", "written", "copied"]
HOUR = 3600.0
PAUSE_WAIT = 60.0


async def offload_killed_at(uri: str, name: str, point: str) -> None:
    """Run ``aiobk log offload`` until it says it stopped at ``point``, then SIGKILL it."""
    child = await asyncio.create_subprocess_exec(
        *CHILD_COMMAND, "log", "offload", name, "--metadata", uri,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, PAUSE_ENV: point},
    )  # fmt: skip
    assert child.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(PAUSE_WAIT):
            while True:
                line = (await child.stderr.readline()).decode()
                assert line, f"the offload ended before {point}: {''.join(seen)}"
                seen.append(line)
                if line.strip() == f"aiobk: offload paused at {point}":
                    break
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL


@pytest.mark.timeout(240)
@pytest.mark.parametrize("point", POINTS)
async def test_an_offload_killed_at_a_point_loses_nothing_and_leaves_nothing(
    etcd_cluster: Cluster, store_url: str, point: str
) -> None:
    uri = etcd_cluster.uri
    sizes = small(3)
    if point == "uploading":  # reached once two blocks of the object have gone to the store
        sizes[0] = [256 * 1024] * (2 * DEFAULT_BLOCK_SIZE // (256 * 1024) + 4)
    async with BookKeeper(uri) as bk:
        sent = await write_log(bk, "killed", sizes)
        ledgers = list((await bk.store.read_log("killed")).ledgers)
        set_ = await aiobk("offload", "store", store_url, "--deletion-lag", "0", "--metadata", uri)
        assert set_.returncode == 0, set_.stderr

        await offload_killed_at(uri, "killed", point)
        record = (await bk.store.read_ledger(ledgers[0])).offload
        assert record is not None
        expected = OffloadState.COPIED if point == "copied" else OffloadState.COPYING
        assert record.state is expected
        reader = await bk.open_log_reader("killed", follow=False)
        assert [r.data async for r in reader] == sent

        # Later, the upkeep takes back the dead attempt and the sweep what no metadata names.
        settings = await bk.store.read_offload_store()
        assert settings is not None
        later = time.time() + 2 * HOUR
        await upkeep(bk.context, bk.objects, settings, now=lambda: later)
        await sweep(bk.context, bk.objects.get(settings.url))
        keys, uploads = await held(store_url)
        assert keys == await named(bk.store, ledgers)
        assert uploads == []

        again = await aiobk("log", "offload", "killed", "--metadata", uri, "--json")
        assert again.returncode == 0, again.stderr
        for ledger_id in ledgers:
            found = (await bk.store.read_ledger(ledger_id)).offload
            assert found is not None
            assert found.state is OffloadState.RELEASED, ledger_id
        assert (await held(store_url))[0] == await named(bk.store, ledgers)
        assert settings.url == canonical(store_url)

    await etcd_cluster.stop()
    assert await tail(uri, "killed") == sent


def test_the_pause_names_a_point() -> None:
    done = subprocess.run(
        [*CHILD_COMMAND, "log", "offload", "x", "--metadata", "etcd://127.0.0.1:1/x"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, PAUSE_ENV: "nowhere"},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"aiobk: error: {PAUSE_ENV}=nowhere: not one of listed, ")
