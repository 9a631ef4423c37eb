"""Autorecovery's figures as Prometheus scrapes them: the values, through the real
exporter of ``aiobk autorecovery start --metrics-port`` (a child process), over real bookies in
process on a real etcd.

- while marks exist the under-replicated gauge counts them;
- once a worker reports a ledger's lost entries the lost-ledgers gauge counts it (the auditor
  recounts the marks for its gauges every ``STATUS_INTERVAL``);
- the bytes re-replicated counter equals the bytes of the copies the replacement holds;
- a process that is no longer the auditor shows no auditor's gauges (its collector, in process).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aiobk.autorecovery import AutoRecovery, AutoRecoveryConfig
from aiobk.autorecovery.auditor import STATUS_INTERVAL
from aiobk.autorecovery.fragments import bookies_named
from aiobk.client import BookKeeper
from aiobk.client.entry_read import ask
from aiobk.metadata import LOST_BOOKIE, EtcdProcess, HeldLease, free_port
from aiobk.metrics import autorecovery_collector
from aiobk.protocol import StatusCode
from tests.autorecovery.watching import key_until, unregistered, watching_marks
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until

SETTINGS = {"registration_ttl": 1.0, "autorecovery_enabled": False}
ENV = {k: v for k, v in os.environ.items() if k != "AIOBK_METADATA"}
NODE = "ar-figures"
REPLICATED_ENTRIES = 10


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("figures"))
    cluster = await start_cluster(tmp_path, 4, uri=uri, **SETTINGS)
    yield cluster
    await cluster.stop()


def _samples(text: str, node: str = NODE) -> dict[str, float]:
    """A node's autorecovery samples in an exposition, by sample name."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("aiobk_autorecovery_") and sample.labels.get("node") == node
    }


def _scrape(port: int) -> dict[str, float]:
    """This node's autorecovery samples, as the exporter serves them."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return _samples(answer.read().decode())


async def _scraped_until(
    port: int, wanted: Callable[[dict[str, float]], bool], seconds: float
) -> dict[str, float]:
    """Scrapes until ``wanted`` holds (an exporter has no event to wait on: asked every 0.2 s)."""
    scraped: list[dict[str, float]] = []

    async def holds() -> bool:
        scraped.append(await asyncio.to_thread(_scrape, port))
        return wanted(scraped[-1])

    await wait_until(holds, every=0.2, timeout=seconds, what="the scraped figures")
    return scraped[-1]


@pytest.mark.timeout(60)
async def test_gauges_and_bytes_as_the_exporter_serves_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    uri = cluster.uri
    config = tmp_path / "autorecovery.toml"
    config.write_text(
        f"metadata_uri = {uri!r}\n"
        "log_level = 'warning'\n"
        "[autorecovery]\n"
        "lost_bookie_recovery_delay = 0.5\n"
        "autorecovery_poll_interval = 0.2\n"
        "autorecovery_lease_ttl = 2.0\n"
        "rereplication_retry_delay = 0.2\n"
    )
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiobk", "autorecovery", "start", "--config", str(config),
        "--id", NODE, "--metrics-port", str(port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line.decode() == f"autorecovery {NODE} running on {uri}\n"
        async with BookKeeper(uri) as bk:
            store = bk.store
            await key_until(store, store.keys.auditor, lambda v: v == NODE.encode(), 20)
            # Workers take nothing while disabled: the marks stay for the gauge to count.
            await store.autorecovery.set_enabled(False)
            single = await bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
            for i in range(5):
                await single.append(b"only copy %d" % i)
            await single.close()
            victim = single.metadata.fragments[0].ensemble[0]
            for _attempt in range(40):  # bounded: each names the victim with odds 3/4
                lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
                for i in range(REPLICATED_ENTRIES):
                    await lh.append(b"entry %d" % i)
                await lh.close()
                if victim in bookies_named(lh.metadata):
                    break
                await bk.delete_ledger(lh.ledger_id)
            assert victim in bookies_named(lh.metadata)
            before = await asyncio.to_thread(_scrape, port)
            assert before["aiobk_autorecovery_under_replicated_ledgers"] == 0
            assert before["aiobk_autorecovery_bytes_replicated_total"] == 0
            async with watching_marks(store) as marks:
                bookie = cluster.by_id(victim)
                cluster.bookies.remove(bookie)
                await bookie.crash()
                shutil.rmtree(bookie.config.data_dir)
                await unregistered(store, victim)
                both = {single.ledger_id, lh.ledger_id}
                await marks.until(lambda m: both <= set(m), 20)
                figures = await _scraped_until(
                    port, lambda f: f["aiobk_autorecovery_under_replicated_ledgers"] > 0, 10
                )
                assert figures["aiobk_autorecovery_under_replicated_ledgers"] == 2
                assert figures["aiobk_autorecovery_lost_bookies"] == 1
                assert both <= set(marks.marks)  # the marks were there all along
                await store.autorecovery.set_enabled(True)
                await marks.until(
                    lambda m: lh.ledger_id not in m and bool(m[single.ledger_id].lost), 20
                )
            # What the replacement holds is what was copied.
            repaired = await store.read_ledger(lh.ledger_id)
            (replacement,) = bookies_named(repaired) - bookies_named(lh.metadata)
            copied = 0
            for entry_id in range(REPLICATED_ENTRIES):
                response = await ask(bk.pool, replacement, lh.ledger_id, entry_id, 5.0)
                assert response.status is StatusCode.EOK
                assert response.body is not None
                copied += len(response.body)
            figures = await _scraped_until(
                port,
                lambda f: f["aiobk_autorecovery_lost_ledgers"] > 0,
                STATUS_INTERVAL + 5,
            )
            assert figures["aiobk_autorecovery_lost_ledgers"] == 1
            assert figures["aiobk_autorecovery_under_replicated_ledgers"] == 0
            assert figures["aiobk_autorecovery_bytes_replicated_total"] == copied
            assert figures["aiobk_autorecovery_entries_replicated_total"] == REPLICATED_ENTRIES
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.timeout(60)
async def test_a_process_no_longer_the_auditor_shows_no_auditor_gauges(cluster: Cluster) -> None:
    """Its last counts stayed exported after another process took over (a sum over the
    processes counted every mark twice)."""
    config = AutoRecoveryConfig(autorecovery_lease_ttl=2.0, autorecovery_poll_interval=0.1)
    service = AutoRecovery(
        cluster.store,
        config,
        "node-a",
        rng=random.Random(1),
        wall_clock=time.time,
        secret_bytes=random.Random(1).randbytes,
        run_worker=False,
    )
    registry = CollectorRegistry()
    registry.register(autorecovery_collector(service.stats, "node-a"))

    def exported() -> dict[str, float]:
        return _samples(generate_latest(registry).decode(), "node-a")

    store = cluster.store
    await store.autorecovery.mark(424242, ["gone:1"], LOST_BOOKIE, 0)
    await service.start()
    holder: HeldLease | None = None
    try:
        # The auditor publishes its status right after counting the marks for its gauges.
        await key_until(store, store.keys.autorecovery_status, lambda v: v is not None, 10)
        assert exported()["aiobk_autorecovery_under_replicated_ledgers"] == 1
        # Its lease is lost (etcd unreachable past its TTL, say) and another takes the seat.
        found, _rev = await store.kv.get(store.keys.auditor)
        assert found is not None
        await store.kv.revoke_lease(found.lease)
        holder = await HeldLease.grant(store.kv, 10.0, "the next auditor")
        assert await store.autorecovery.elect("node-b", holder.id)
        # No event says it stepped down: asked every 50 ms.
        await wait_until(lambda: service.auditor is None, timeout=10, what="stepped down")
        assert await store.autorecovery.auditor() == "node-b"
        figures = exported()
        assert figures["aiobk_autorecovery_under_replicated_ledgers"] == 0
        assert figures["aiobk_autorecovery_lost_ledgers"] == 0
        assert figures["aiobk_autorecovery_lost_bookies"] == 0
        assert figures["aiobk_autorecovery_auditor_elections_total"] == 1
    finally:
        await service.stop()
        if holder is not None:
            await holder.close()
