"""The bookie's gauges move, read as an operator reads
them: the HTTP admin API's ``/metrics`` (the collectors the ``--metrics-port`` exporter
serves), ``/api/v1/bookie/state`` and ``/api/v1/bookie/info``, on a bookie in this process
with real files. Moments that load only makes likely are made certain: a journal write held on
the journal's I/O lane (``HeldJournalDisk``), a full disk that ``FaultyDisk`` reports."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aiobk.bookie import Bookie, BookieConfig
from aiobk.bookie.disk import AppendFile, Disk, OsDisk
from aiobk.bookie.index.twin import TwinIndex
from aiobk.bookie.journal.policy import INLINE_BYTES
from aiobk.client import BookKeeper
from aiobk.http_admin import HttpAdmin
from aiobk.metadata import MemoryKV
from aiobk.runner import start_http_admin
from tests.support.append_file import DelegatingAppendFile
from tests.support.faulty_disk import FaultyDisk
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS

pytestmark = pytest.mark.timeout(60)

QUIET = {
    "gc_interval": 0,
    "autorecovery_enabled": False,
    "flush_interval": 3600.0,  # no checkpoint empties the write cache unless the test asks
    "disk_check_interval": 3600.0,  # the disk is measured when the test asks
}


class HeldJournalDisk(TwinIndex, OsDisk):
    """Real files; while ``holding``, a journal write made on the journal's I/O lane (a batch
    the writer hands off rather than syncing inline) waits for ``release``. ``held`` is set
    once one waits."""

    def __init__(self, journal_dir: str) -> None:
        super().__init__()
        self.journal_dir = journal_dir
        self.holding = False
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def open_append(
        self, path: str, lane: str, sync_lane: str | None = None, preallocate: int = 0
    ) -> AppendFile:
        inner = await super().open_append(path, lane, sync_lane, preallocate)
        if Path(path).parent == Path(self.journal_dir):
            return _HeldFile(self, inner)
        return inner


class _HeldFile(DelegatingAppendFile):
    def __init__(self, disk: HeldJournalDisk, inner: AppendFile) -> None:
        super().__init__(inner)
        self._disk = disk

    async def write(self, data: bytes) -> None:
        if self._disk.holding:
            self._disk.held.set()
            await self._disk.release.wait()
        await self._inner.write(data)


@dataclass
class Admin:
    bookie: Bookie
    http: HttpAdmin
    session: aiohttp.ClientSession
    uri: str

    async def get(self, path: str) -> Any:
        async with self.session.get(self.http.url + path) as response:
            assert response.status == 200, (path, await response.text())
            if response.content_type == "application/json":
                return json.loads(await response.text())
            return await response.text()

    async def put_state(self, read_only: bool) -> tuple[int, Any]:
        body = json.dumps({"readOnly": read_only})
        async with self.session.put(self.http.url + "/api/v1/bookie/state", data=body) as answer:
            return answer.status, json.loads(await answer.text())

    async def samples(self) -> dict[str, float]:
        """This bookie's figures from ``/metrics``, by sample name (one bookie: one each)."""
        text = await self.get("/metrics")
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("bookie") == self.bookie.bookie_id and "dir" not in (
                    sample.labels
                ):
                    key = sample.name
                    if "le" in sample.labels:
                        key += f"{{le={sample.labels['le']}}}"
                    assert key not in out, key
                    out[key] = sample.value
        return out

    async def gauge(self, name: str) -> float:
        return (await self.samples())[f"aiobk_bookie_{name}"]


async def _start(tmp_path: Path, disk: Disk, **settings: Any) -> Admin:
    uri = f"memory://{unique_name('gauges')}"
    config = BookieConfig(
        data_dir=str(tmp_path / "bookie"),
        port=0,
        http_port=0,
        metadata_uri=uri,
        **{**HOST_DISK_SETTINGS, **QUIET, **settings},
    )
    bookie = Bookie(config, disk=disk)
    await bookie.start()
    http = await start_http_admin(bookie)
    assert http is not None
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    return Admin(bookie, http, session, uri)


async def _stop(admin: Admin) -> None:
    await admin.session.close()
    await admin.http.stop()
    await admin.bookie.stop()
    MemoryKV.forget(admin.uri[len("memory://") :])


@pytest.fixture
async def held(tmp_path: Path) -> AsyncIterator[tuple[Admin, HeldJournalDisk]]:
    journal_dir = str(tmp_path / "bookie" / "journal")
    disk = HeldJournalDisk(journal_dir)
    admin = await _start(tmp_path, disk, journal_dir=journal_dir)
    assert admin.bookie.config.journal_path == journal_dir
    try:
        yield admin, disk
    finally:
        disk.release.set()
        await _stop(admin)


async def test_journal_queue_depth_rises_while_a_write_is_on_the_disk(
    held: tuple[Admin, HeldJournalDisk],
) -> None:
    """While one batch is being written, the adds that come meanwhile wait in the journal's
    queue: the gauge shows them, and shows the queue empty once the write is done. The held
    write is one apart from its fdatasync: the journal write latency histogram counts it."""
    admin, disk = held
    assert await admin.gauge("journal_queue_size") == 0
    async with await BookKeeper.connect(admin.uri) as bk:
        lh = await bk.create_ledger(1, 1, 1)
        await lh.append(b"first")  # the ledger's state exists: the next adds are plain adds
        before = await admin.samples()
        disk.holding = True
        big = asyncio.ensure_future(lh.append(b"b" * (INLINE_BYTES + 1)))  # too big to inline
        async with asyncio.timeout(10):
            await disk.held.wait()
        small = [asyncio.ensure_future(lh.append(b"s%d" % i)) for i in range(5)]
        queued = 0.0
        async with asyncio.timeout(10):  # until the bookie has read the adds off the socket
            while queued == 0:
                queued = await admin.gauge("journal_queue_size")
        assert 1 <= queued <= 5
        info = await admin.get("/api/v1/bookie/info")
        assert info["figures"]["journal_queue_size"] >= queued  # more may have come since
        assert not big.done()
        disk.holding = False
        disk.release.set()
        async with asyncio.timeout(10):
            assert await asyncio.gather(big, *small) == list(range(1, 7))
    after = await admin.samples()
    assert after["aiobk_bookie_journal_queue_size"] == 0
    flushed = "aiobk_bookie_journal_flush_seconds_count"
    assert after[flushed] >= before[flushed] + 1
    assert after["aiobk_bookie_journal_flush_seconds_sum"] > 0


async def test_write_and_read_cache_use_rise_with_adds_and_reads(tmp_path: Path) -> None:
    admin = await _start(tmp_path, OsDisk())
    try:
        first = await admin.samples()
        assert first["aiobk_bookie_write_cache_bytes"] == 0
        assert first["aiobk_bookie_read_cache_bytes"] == 0
        assert first["aiobk_bookie_ledgers_held"] == 0
        async with await BookKeeper.connect(admin.uri) as bk:
            lh = await bk.create_ledger(1, 1, 1)
            for i in range(10):
                await lh.append(b"entry %d" % i * 10)
            await lh.close()
            written = await admin.samples()
            assert written["aiobk_bookie_write_cache_bytes"] > 0  # entry locations held
            assert written["aiobk_bookie_read_cache_bytes"] == 0  # nothing read yet
            assert written["aiobk_bookie_ledgers_held"] == 1
            rh = await bk.open_ledger(lh.ledger_id, recovery=False)
            assert len(await rh.read(0, 9)) == 10
            read = await admin.samples()
            assert read["aiobk_bookie_read_cache_bytes"] >= 10 * len(b"entry 0" * 10)
            assert (
                read["aiobk_bookie_read_cache_bytes"] <= read["aiobk_bookie_read_cache_max_bytes"]
            )
            assert len(await rh.read(0, 9)) == 10
            again = await admin.samples()
            assert again["aiobk_bookie_read_cache_hits_total"] >= 10
        info = await admin.get("/api/v1/bookie/info")
        assert info["figures"]["write_cache_bytes"] == written["aiobk_bookie_write_cache_bytes"]
        assert info["figures"]["read_cache_bytes"] == again["aiobk_bookie_read_cache_bytes"]
        # A checkpoint makes the locations durable in the index: the write cache empties.
        await admin.bookie.checkpoint()
        assert await admin.gauge("write_cache_bytes") == 0
    finally:
        await _stop(admin)


async def test_writable_gauge_and_state_follow_the_operator_and_a_full_disk(
    tmp_path: Path,
) -> None:
    disk = FaultyDisk()
    # The thresholds of a real bookie (not the tests' 1.0): the disk is judged by FaultyDisk's
    # figures, whatever this host's disk holds.
    admin = await _start(
        tmp_path,
        disk,
        disk_usage_threshold=0.95,
        disk_usage_warn_threshold=0.90,
        disk_usage_lwm_threshold=0.90,
    )
    bookie = admin.bookie
    try:
        await bookie.disk_monitor.check()
        assert await admin.gauge("writable") == 1

        status, state = await admin.put_state(True)
        assert (status, state["state"], state["readOnly"]) == (200, "readonly", True)
        assert await admin.gauge("writable") == 0
        status, state = await admin.put_state(False)
        assert (status, state["state"]) == (200, "writable")
        assert await admin.gauge("writable") == 1

        disk.free = int(0.04 * (1 << 40))  # 96% used: over disk_usage_threshold
        await bookie.disk_monitor.check()
        assert await admin.gauge("writable") == 0
        state = await admin.get("/api/v1/bookie/state")
        assert (state["state"], state["readOnly"]) == ("readonly", True)
        assert len(state["reasons"]) == 1
        assert state["reasons"][0].startswith("disk:"), state
        assert "96.0% used" in state["reasons"][0]
        info = await admin.get("/api/v1/bookie/info")
        assert (info["state"], info["readOnly"], info["reasons"]) == (
            "readonly",
            True,
            state["reasons"],
        )
        assert info["figures"]["writable"] == 0
        # The operator cannot lift a full disk's read-only state.
        status, document = await admin.put_state(False)
        assert status == 409, document
        assert (document["state"], document["reasons"]) == ("readonly", state["reasons"])
        assert await admin.gauge("writable") == 0

        disk.free = int(0.5 * (1 << 40))  # under the low-water mark: writable again
        await bookie.disk_monitor.check()
        assert await admin.gauge("writable") == 1
        state = await admin.get("/api/v1/bookie/state")
        assert (state["state"], state["readOnly"], state["reasons"]) == ("writable", False, [])
    finally:
        await _stop(admin)
