"""The replication worker's decisions, one ledger at a time, on real bookies in process (memory
store): the worker is driven directly (the bookies run no autorecovery of their own), so each
test sets up a mark and looks at exactly what one repair does."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery import AutoRecoveryConfig, Outcome, ReplicationWorker, WorkerSwitches
from aiobk.autorecovery.fragments import bookies_named, closed_fragments
from aiobk.bookie import Bookie
from aiobk.client import BookKeeper, ClientConfig, LedgerHandle
from aiobk.client.offload import offload_ledger
from aiobk.metadata import DECOMMISSION, LOST_BOOKIE, OffloadStoreSettings
from aiobk.protocol import DigestType
from aiobk.protocol.errors import LedgerFencedError
from tests.autorecovery.helpers import assert_copies
from tests.support.cluster import Cluster, forget, start_cluster
from tests.support.wait import wait_until

SETTINGS = {"registration_ttl": 1.0, "autorecovery_enabled": False}
CONFIG = AutoRecoveryConfig(
    lost_bookie_recovery_delay=0.0,
    open_ledger_rereplication_grace_period=2.0,
    rereplication_retry_delay=0.2,
    autorecovery_poll_interval=0.1,
)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 5, **SETTINGS)
    yield cluster
    await cluster.stop()
    forget(cluster)


@pytest.fixture
async def bk(cluster: Cluster) -> AsyncIterator[BookKeeper]:
    async with BookKeeper(cluster.uri, ClientConfig(read_timeout=2.0, add_timeout=2.0)) as bk:
        yield bk


def _worker(bk: BookKeeper, **switches: bool) -> ReplicationWorker:
    return ReplicationWorker(
        bk.context,
        CONFIG,
        "test-worker",
        wall_clock=time.time,
        secret_bytes=random.Random(5).randbytes,
        switches=WorkerSwitches(**switches),
    )


async def _ledger(bk: BookKeeper, entries: int = 20, **shape: object) -> int:
    settings = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, **shape}
    lh = await bk.create_ledger(**settings)  # type: ignore[arg-type]
    for i in range(entries):
        await lh.append(b"entry %d" % i)
    await lh.close()
    return lh.ledger_id


async def _lose(cluster: Cluster, bookie: Bookie) -> None:
    """A bookie gone for good: crashed, its disk gone, out of the registry."""
    await bookie.crash()  # left in the cluster's list: its stop() does nothing now
    shutil.rmtree(bookie.config.data_dir)
    store = cluster.store

    async def gone() -> bool:
        return bookie.bookie_id not in {b.bookie_id for b in await store.list_bookies()}

    await wait_until(gone, every=0.1, timeout=10, what=f"{bookie.bookie_id} left the registry")


async def _every_copy_synced(cluster: Cluster, lh: LedgerHandle) -> None:
    """Each bookie of the last ensemble synced the last entry: its answer is on its way to the
    writer, whose append returned at the ack quorum."""
    last = lh.last_add_pushed

    def synced() -> bool:
        states = [cluster.by_id(b).storage.get(lh.ledger_id) for b in lh.metadata.ensemble]
        return all(s is not None and s.last_add_synced >= last for s in states)

    await wait_until(synced, every=0.01, timeout=10, what=f"entry {last} synced on every copy")


@pytest.mark.timeout(60)
async def test_a_lost_bookie_is_replaced_in_every_fragment_and_the_mark_goes(
    cluster: Cluster, bk: BookKeeper
) -> None:
    ledger_id = await _ledger(bk)
    metadata = await bk.store.read_ledger(ledger_id)
    victim = metadata.fragments[0].ensemble[1]
    await _lose(cluster, cluster.by_id(victim))
    mark = await bk.store.autorecovery.mark(ledger_id, [victim], LOST_BOOKIE, 0)
    worker = _worker(bk)
    assert await worker.repair(mark) is Outcome.REPAIRED
    repaired = await bk.store.read_ledger(ledger_id)
    assert victim not in bookies_named(repaired)
    assert repaired.last_entry_id == metadata.last_entry_id
    await assert_copies(bk, ledger_id, read_back=False)
    assert await bk.store.autorecovery.read_mark(ledger_id) is None
    assert worker.stats.entries_replicated == 20
    assert worker.stats.fragments_replicated == 1


@pytest.mark.timeout(60)
async def test_a_bookie_that_came_back_with_its_copies_keeps_them(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """pulsar#1886: a returning bookie's ledgers were copied anyway."""
    ledger_id = await _ledger(bk)
    metadata = await bk.store.read_ledger(ledger_id)
    back = metadata.fragments[0].ensemble[0]
    mark = await bk.store.autorecovery.mark(ledger_id, [back], LOST_BOOKIE, 0)
    worker = _worker(bk)
    assert await worker.repair(mark) is Outcome.REPAIRED
    assert (await bk.store.read_ledger(ledger_id)).fragments == metadata.fragments
    assert worker.stats.entries_replicated == 0
    assert await bk.store.autorecovery.read_mark(ledger_id) is None


@pytest.mark.timeout(60)
async def test_entries_no_bookie_has_are_reported_once_and_not_retried(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """apache/bookkeeper#4872: a WQ=1 ledger on a lost bookie was retried forever."""
    ledger_id = await _ledger(bk, 5, ensemble_size=1, write_quorum=1, ack_quorum=1)
    metadata = await bk.store.read_ledger(ledger_id)
    victim = metadata.fragments[0].ensemble[0]
    await _lose(cluster, cluster.by_id(victim))
    mark = await bk.store.autorecovery.mark(ledger_id, [victim], LOST_BOOKIE, 0)
    worker = _worker(bk)
    assert await worker.repair(mark) is Outcome.REPORTED
    report = await bk.store.autorecovery.read_mark(ledger_id)
    assert report is not None
    assert report.lost == ((0, 4),)
    assert report.missing == ()
    assert victim not in bookies_named(await bk.store.read_ledger(ledger_id))
    assert not await worker.run_once()  # a report is not work: nothing taken


@pytest.mark.timeout(60)
async def test_a_deleted_ledger_drops_its_mark(cluster: Cluster, bk: BookKeeper) -> None:
    ledger_id = await _ledger(bk, 3)
    mark = await bk.store.autorecovery.mark(ledger_id, ["gone:1"], LOST_BOOKIE, 0)
    await bk.delete_ledger(ledger_id)
    assert await _worker(bk).repair(mark) is Outcome.GONE
    assert await bk.store.autorecovery.read_mark(ledger_id) is None


@pytest.mark.timeout(60)
async def test_an_offloaded_ledger_drops_its_mark_and_no_copy_is_written(
    cluster: Cluster, bk: BookKeeper, tmp_path: Path
) -> None:
    (tmp_path / "objects").mkdir()
    await bk.store.set_offload_store(OffloadStoreSettings(f"file://{tmp_path / 'objects'}", 0))
    ledger_id = await _ledger(bk, 5)
    settings = await bk.store.read_offload_store()
    assert settings is not None
    done = await offload_ledger(bk.context, bk.objects, settings, ledger_id, now=time.time)
    assert done.outcome == "released"
    before = (await bk.store.read_ledger(ledger_id)).fragments
    mark = await bk.store.autorecovery.mark(ledger_id, ["gone:1"], LOST_BOOKIE, 0)
    assert await _worker(bk).repair(mark) is Outcome.OFFLOADED
    assert await bk.store.autorecovery.read_mark(ledger_id) is None
    assert (await bk.store.read_ledger(ledger_id)).fragments == before  # no copy moved


@pytest.mark.timeout(60)
async def test_an_open_ledger_waits_its_grace_then_is_recovered_and_repaired(
    cluster: Cluster, bk: BookKeeper, caplog: pytest.LogCaptureFixture
) -> None:
    # An idle writer: no explicit LAC after its last add, which would meet the lost bookie and
    # make the writer change its ensemble by itself.
    writer = await BookKeeper.connect(cluster.uri, ClientConfig(explicit_lac_delay=0))
    lh = await writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    for i in range(10):
        await lh.append(b"open %d" % i)
    await _every_copy_synced(cluster, lh)  # the third copy too (append returns at two of three)
    victim = lh.metadata.fragments[-1].ensemble[2]
    await _lose(cluster, cluster.by_id(victim))
    since = int(time.time() * 1000)
    mark = await bk.store.autorecovery.mark(lh.ledger_id, [victim], LOST_BOOKIE, since)
    worker = _worker(bk)
    caplog.set_level(logging.DEBUG, logger="aiobk.autorecovery.worker")
    assert await worker.repair(mark) is Outcome.DEFERRED  # the writer may still fix it itself
    # The grace is counted on the worker's clock, the wall clock (a mark's `since` is written by
    # another process), which runs slower than the loop's while NTP slews it back: a CI run slept
    # the grace on the loop's clock and the worker found it not yet over.
    grace_over = since / 1000 + CONFIG.open_ledger_rereplication_grace_period
    await wait_until(lambda: time.time() >= grace_over, timeout=10, what="the grace is over")
    assert await worker.repair(mark) is Outcome.REPAIRED, caplog.text
    closed = await bk.store.read_ledger(lh.ledger_id)
    assert closed.is_closed
    assert closed.last_entry_id == 9
    assert victim not in bookies_named(closed)
    await assert_copies(bk, lh.ledger_id, read_back=False)
    assert worker.stats.ledgers_recovered == 1
    with pytest.raises(LedgerFencedError):
        await lh.append(b"too late")
    await writer.close()


@pytest.mark.timeout(60)
async def test_with_no_bookie_to_copy_to_the_repair_fails_and_backs_off(
    cluster: Cluster, bk: BookKeeper
) -> None:
    ledger_id = await _ledger(bk, 4, ensemble_size=5, write_quorum=5, ack_quorum=3)
    victim = (await bk.store.read_ledger(ledger_id)).fragments[0].ensemble[4]
    await _lose(cluster, cluster.by_id(victim))  # four bookies left for an ensemble of five
    await bk.store.autorecovery.mark(ledger_id, [victim], LOST_BOOKIE, 0)
    worker = _worker(bk)
    assert await worker.run_once()  # taken, failed
    assert worker.stats.repair_failures == 1
    assert not await worker.run_once()  # backing off: not taken again at once
    assert await bk.store.autorecovery.read_mark(ledger_id) is not None
    await cluster.add_bookie()  # a bookie to copy to
    await asyncio.sleep(CONFIG.rereplication_retry_delay * 1.5)
    assert await worker.run_once()
    assert await bk.store.autorecovery.read_mark(ledger_id) is None


@pytest.mark.timeout(60)
async def test_a_cancelled_repair_stops_noting_its_attempt(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """A worker stopped mid-copy leaves no task behind noting the attempt it gave up."""
    ledger_id = await _ledger(bk, 60)
    victim = (await bk.store.read_ledger(ledger_id)).fragments[0].ensemble[0]
    await _lose(cluster, cluster.by_id(victim))
    await bk.store.autorecovery.mark(ledger_id, [victim], LOST_BOOKIE, 0)
    slow = dataclasses.replace(CONFIG, rereplication_max_bytes_per_second=50)  # ~10 s of copying
    worker = ReplicationWorker(
        bk.context, slow, "slow-worker", wall_clock=time.time,
        secret_bytes=random.Random(5).randbytes,
    )  # fmt: skip

    def noting() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if t.get_name() == "attempt-notes" and not t.done()]

    repair = asyncio.create_task(worker.run_once())
    await wait_until(lambda: bool(noting()), every=0.01, timeout=10, what="an attempt noted")
    await asyncio.sleep(0.2)  # an absence window: still copying, under its throttle
    assert not repair.done()
    repair.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await repair
    for _turn in range(3):
        await asyncio.sleep(0)
    assert noting() == []
    assert await bk.store.autorecovery.claimant(ledger_id) is None  # released


@pytest.mark.timeout(60)
async def test_disabled_autorecovery_takes_nothing(cluster: Cluster, bk: BookKeeper) -> None:
    ledger_id = await _ledger(bk, 3)
    await bk.store.autorecovery.mark(ledger_id, ["gone:1"], LOST_BOOKIE, 0)
    await bk.store.autorecovery.set_enabled(False)
    worker = _worker(bk)
    assert not await worker.run_once()
    await bk.store.autorecovery.set_enabled(True)
    assert await worker.run_once()


@pytest.mark.timeout(60)
async def test_a_decommissioned_bookie_is_drained_while_alive_and_is_a_source(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """With E = WQ = 3 of 5 bookies and two copies gone (the third is the draining bookie's),
    the entries come from the bookie being drained."""
    ledger_id = await _ledger(bk, 6)
    metadata = await bk.store.read_ledger(ledger_id)
    draining, *others = metadata.fragments[0].ensemble
    await bk.store.autorecovery.set_decommissioning(draining, True)
    mark = await bk.store.autorecovery.mark(ledger_id, [draining], DECOMMISSION, 0)
    assert await _worker(bk).repair(mark) is Outcome.REPAIRED
    drained = await bk.store.read_ledger(ledger_id)
    assert draining not in bookies_named(drained)
    assert set(others) <= bookies_named(drained)
    await assert_copies(bk, ledger_id, read_back=False)


@pytest.mark.timeout(60)
async def test_a_mac_ledger_is_copied_but_an_open_one_needs_its_writer(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """A worker has no password: copies of a MAC ledger are checked for their ids only, and an
    open MAC ledger cannot be recovered by it (recovery re-signs write-backs)."""
    closed_id = await _ledger(bk, 5, password=b"pw", digest_type=DigestType.MAC)
    # An idle writer that will not change its ensemble by itself (see the grace-period test).
    writer = await BookKeeper.connect(cluster.uri, ClientConfig(explicit_lac_delay=0))
    lh = await writer.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw", digest_type=DigestType.MAC
    )
    await lh.append(b"open")
    await _every_copy_synced(cluster, lh)  # the third copy too
    victims = set((await bk.store.read_ledger(closed_id)).fragments[0].ensemble) & set(
        lh.metadata.fragments[0].ensemble
    )
    victim = sorted(victims)[0]
    await _lose(cluster, cluster.by_id(victim))
    worker = _worker(bk)
    closed_mark = await bk.store.autorecovery.mark(closed_id, [victim], LOST_BOOKIE, 0)
    assert await worker.repair(closed_mark) is Outcome.REPAIRED
    await assert_copies(bk, closed_id, read_back=False)
    open_mark = await bk.store.autorecovery.mark(lh.ledger_id, [victim], LOST_BOOKIE, 0)
    assert await worker._attempt(open_mark) is Outcome.FAILED
    assert not (await bk.store.read_ledger(lh.ledger_id)).is_closed
    await writer.close()


@pytest.mark.timeout(60)
async def test_a_stale_swap_is_refused_with_the_version_fence_and_overwrites_without(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """Two workers on one ledger: the second to write read the ledger before the first wrote.
    With the fence, its compare-and-set fails and it backs off; without, it writes its stale
    view over the first one's swap."""
    ledger_id = await _ledger(bk, 4)
    read = await bk.store.read_ledger(ledger_id)
    fragment = closed_fragments(read)[0]
    spare = sorted({b.bookie_id for b in cluster.bookies} - set(fragment.ensemble))
    assert len(spare) == 2
    first = await _worker(bk)._swap(ledger_id, read, fragment, 0, spare[0])
    assert first is not None
    assert await _worker(bk)._swap(ledger_id, read, fragment, 1, spare[1]) is None
    assert (await bk.store.read_ledger(ledger_id)).fragments == first.fragments
    blind = await _worker(bk, metadata_version_fence=False)._swap(
        ledger_id, read, fragment, 1, spare[1]
    )
    assert blind is not None
    assert blind.fragments[0].ensemble[0] == fragment.ensemble[0]  # the first swap undone
