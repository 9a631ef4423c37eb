"""Garbage collection of deleted ledgers: the pure decisions, then real bookies and stores."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiobk.bookie import Bookie
from aiobk.bookie.compaction import compaction_candidates
from aiobk.bookie.gc import garbage_candidates, removable_logs, unlisted
from aiobk.client import BookKeeper, LedgerHandle
from aiobk.metadata import EtcdProcess
from aiobk.protocol.errors import MetadataStoreError
from tests.support.cluster import Cluster, forget, start_cluster

# Small logs, gc on demand only, compaction off unless a test turns it on.
SMALL_LOGS = {
    "entry_log_max_size": 16 * 1024,
    "entry_log_write_buffer": 4096,
    "gc_interval": 0,
    "gc_compaction_threshold": 0.0,
}
PAYLOAD = 1000


def test_candidates_are_held_but_not_listed() -> None:
    assert garbage_candidates([1, 2, 3, 7], [2, 3, 4]) == {1, 7}
    assert garbage_candidates([], [1]) == set()


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 60)), st.sets(st.integers(0, 60)))
def test_the_streamed_merge_finds_what_the_listing_does_not_name(
    held: set[int], listed: set[int]
) -> None:
    """GC walks its own ids and the listing, both ascending, holding neither whole."""

    async def listing() -> AsyncIterator[int]:
        for ledger_id in sorted(listed):
            yield ledger_id

    found = asyncio.run(unlisted(iter(sorted(held)), listing()))
    assert found == sorted(garbage_candidates(held, listed))


def test_only_complete_unreferenced_logs_go() -> None:
    assert removable_logs([0, 1, 2, 3], {1, 3}) == [0, 2]
    assert removable_logs([], {1}) == []


def test_compaction_picks_the_emptiest_logs_under_the_threshold() -> None:
    live = Counter({1: 10, 2: 60, 3: 1, 4: 0, 5: 49})
    records = {1: 100, 2: 100, 3: 100, 4: 100, 5: 100}
    assert compaction_candidates(live, records, 0.5, 8) == [3, 1, 5]  # 4: removed, not moved
    assert compaction_candidates(live, records, 0.5, 2) == [3, 1]
    assert compaction_candidates(live, records, 0.05, 8) == [3]
    assert compaction_candidates(live, {1: 0}, 0.5, 8) == []


@contextlib.asynccontextmanager
async def _one_bookie(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[Cluster, BookKeeper]]:
    """One in-process bookie on a memory store, and a client of it."""
    cluster = await start_cluster(tmp_path, 1, **settings)
    try:
        async with await BookKeeper.connect(cluster.uri) as bk:
            yield cluster, bk
    finally:
        await cluster.stop()
        forget(cluster)


def _log_bytes(bookie: Bookie) -> int:
    directory = os.path.join(bookie.config.ledgers_path, "entries")
    names = [n for n in os.listdir(directory) if n.endswith(".log")]
    return sum(os.path.getsize(os.path.join(directory, n)) for n in names)


async def _fill(lh: LedgerHandle, tag: bytes, count: int) -> None:
    await asyncio.gather(*(lh.append(tag + b"%06d" % i + b"." * PAYLOAD) for i in range(count)))


async def _check(lh_id: int, bk: BookKeeper, count: int, tag: bytes) -> None:
    rh = await bk.open_ledger(lh_id)
    entries = await rh.read(0, count - 1)
    assert [e.data[: len(tag) + 6] for e in entries] == [tag + b"%06d" % i for i in range(count)]


async def _two_ledgers(bk: BookKeeper) -> tuple[LedgerHandle, LedgerHandle]:
    """``keep`` has entries in the first and the last logs; ``doomed`` fills the ones between."""
    keep = await bk.create_ledger(1, 1, 1)
    doomed = await bk.create_ledger(1, 1, 1)
    await _fill(keep, b"k", 20)
    await _fill(doomed, b"d", 120)
    for i in range(20, 40):
        await keep.append(b"k%06d" % i + b"." * PAYLOAD)
    await keep.close()
    await doomed.close()
    return keep, doomed


async def test_gc_reclaims_a_deleted_ledger_and_keeps_the_live_one(tmp_path: Path) -> None:
    async with _one_bookie(tmp_path, **SMALL_LOGS) as (cluster, bk):
        keep, doomed = await _two_ledgers(bk)
        bookie = cluster.bookies[0]
        await bookie.checkpoint()
        before = _log_bytes(bookie)
        nothing = await bookie.collect_garbage()
        assert nothing.ledgers_deleted == []
        assert nothing.logs_removed == []
        await bk.delete_ledger(doomed.ledger_id)
        result = await bookie.collect_garbage()
        assert result.skipped == ""
        assert result.ledgers_deleted == [doomed.ledger_id]
        assert len(result.logs_removed) >= 4  # 120 KiB of it in 16 KiB logs
        assert result.bytes_freed >= 60 * 1024
        assert before - _log_bytes(bookie) == result.bytes_freed
        assert doomed.ledger_id not in bookie.storage.ledgers
        assert bookie.stats.gc_bytes_freed == result.bytes_freed
        await _check(keep.ledger_id, bk, 40, b"k")
        again = await bookie.collect_garbage()
        assert again.ledgers_deleted == []
        assert again.logs_removed == []

        await bookie.stop()  # the deletion survives a restart ...
        bookie = await cluster.restart(bookie)
        assert doomed.ledger_id not in bookie.storage.ledgers
        await _check(keep.ledger_id, bk, 40, b"k")


async def test_gc_then_a_crash_brings_nothing_back(tmp_path: Path) -> None:
    async with _one_bookie(tmp_path, **SMALL_LOGS) as (cluster, bk):
        keep, doomed = await _two_ledgers(bk)
        bookie = cluster.bookies[0]
        await bk.delete_ledger(doomed.ledger_id)
        result = await bookie.collect_garbage()
        assert result.logs_removed
        await bookie.crash()  # ... and a crash right after it
        bookie = await cluster.restart(bookie)
        assert doomed.ledger_id not in bookie.storage.ledgers
        await _check(keep.ledger_id, bk, 40, b"k")


async def test_periodic_gc_runs_on_its_own(tmp_path: Path) -> None:
    async with _one_bookie(tmp_path, **{**SMALL_LOGS, "gc_interval": 0.1}) as (cluster, bk):
        keep, doomed = await _two_ledgers(bk)
        bookie = cluster.bookies[0]
        await bk.delete_ledger(doomed.ledger_id)
        for _ in range(100):
            if doomed.ledger_id not in bookie.storage.ledgers and bookie.stats.gc_logs_removed:
                break
            await asyncio.sleep(0.1)
        assert doomed.ledger_id not in bookie.storage.ledgers
        assert bookie.stats.gc_logs_removed >= 4
        await _check(keep.ledger_id, bk, 40, b"k")


async def test_a_pass_that_fails_unexpectedly_does_not_end_periodic_gc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever one pass raises, the next pass runs: a GC loop that ended on an error a pass
    did not expect left a bookie's disk growing for the rest of its life."""
    async with _one_bookie(tmp_path, **{**SMALL_LOGS, "gc_interval": 0.1}) as (cluster, bk):
        keep, doomed = await _two_ledgers(bk)
        bookie = cluster.bookies[0]
        real = type(bookie.gc).collect
        failures = []

        async def failing_once(self: object, forced: bool = False) -> object:
            if not failures:
                failures.append(1)
                raise RuntimeError("an error no pass expects")
            return await real(bookie.gc, forced)

        monkeypatch.setattr(type(bookie.gc), "collect", failing_once)
        await bk.delete_ledger(doomed.ledger_id)
        for _ in range(100):
            if doomed.ledger_id not in bookie.storage.ledgers and bookie.stats.gc_logs_removed:
                break
            await asyncio.sleep(0.1)
        assert failures == [1]
        assert doomed.ledger_id not in bookie.storage.ledgers
        await _check(keep.ledger_id, bk, 40, b"k")


@pytest.mark.timeout(120)
async def test_gc_with_etcd_down_deletes_nothing_then_resumes(tmp_path: Path) -> None:
    etcd = EtcdProcess(data_dir=str(tmp_path / "etcd")).start()
    cluster = Cluster(tmp_path, etcd.uri("gc"), settings=SMALL_LOGS)
    try:
        await cluster.add_bookie()
        bookie = cluster.bookies[0]
        async with await BookKeeper.connect(cluster.uri) as bk:
            keep, doomed = await _two_ledgers(bk)
            await bk.delete_ledger(doomed.ledger_id)
        await bookie.checkpoint()  # buffered entries reach the logs now, not during the pass
        before = _log_bytes(bookie)
        etcd.stop(remove_data=False)
        result = await asyncio.wait_for(bookie.collect_garbage(), 60)
        assert result.skipped.startswith("metadata store")
        assert result.ledgers_deleted == []
        assert result.logs_removed == []
        assert doomed.ledger_id in bookie.storage.ledgers
        assert _log_bytes(bookie) == before
        etcd.start()
        for _ in range(20):  # the store's connection comes back within a few passes
            result = await asyncio.wait_for(bookie.collect_garbage(), 60)
            if not result.skipped:
                break
            await asyncio.sleep(0.5)
        assert result.ledgers_deleted == [doomed.ledger_id], result.skipped
        assert result.logs_removed
        async with await BookKeeper.connect(cluster.uri) as bk:
            await _check(keep.ledger_id, bk, 40, b"k")
    finally:
        await cluster.stop()
        etcd.stop()


async def _interleaved(bk: BookKeeper) -> tuple[LedgerHandle, LedgerHandle]:
    """Every entry log gets some of ``keep`` (one in five entries) and ``doomed``."""
    keep = await bk.create_ledger(1, 1, 1)
    doomed = await bk.create_ledger(1, 1, 1)
    for i in range(30):
        await keep.append(b"k%06d" % i + b"." * PAYLOAD)
        await _fill(doomed, b"d%03d" % i, 4)
    await keep.close()
    await doomed.close()
    return keep, doomed


@pytest.mark.parametrize("threshold", [0.5, 0.0], ids=["compaction", "no-compaction"])
async def test_compaction_frees_logs_shared_with_a_live_ledger(
    tmp_path: Path, threshold: float
) -> None:
    settings = {**SMALL_LOGS, "gc_compaction_threshold": threshold}
    async with _one_bookie(tmp_path, **settings) as (cluster, bk):
        keep, doomed = await _interleaved(bk)
        bookie = cluster.bookies[0]
        await bookie.stop()  # counts of the old logs must now come from the logs themselves
        bookie = await cluster.restart(bookie)
        await bk.delete_ledger(doomed.ledger_id)
        result = await bookie.collect_garbage()
        assert result.ledgers_deleted == [doomed.ledger_id]
        if threshold == 0:
            assert result.logs_removed == []  # every log holds some of `keep`
            assert result.entries_moved == 0
        else:
            assert len(result.logs_compacted) >= 5
            assert result.logs_removed == result.logs_compacted
            assert 20 <= result.entries_moved <= 30
            assert bookie.stats.gc_entries_moved == result.entries_moved
            entries = os.path.join(bookie.config.ledgers_path, "entries")
            assert not {n for n in os.listdir(entries) if n.endswith(".cnt")} & {
                f"{i:08x}.cnt" for i in result.logs_compacted
            }
        await _check(keep.ledger_id, bk, 30, b"k")
        await bookie.crash()  # right after: the copies and the index are durable
        bookie = await cluster.restart(bookie)
        await _check(keep.ledger_id, bk, 30, b"k")
        again = await bookie.collect_garbage()
        assert again.entries_moved == 0 or threshold > 0
        await _check(keep.ledger_id, bk, 30, b"k")


async def _aiobk(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiobk", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_operator_triggers_a_pass_from_the_cli(tmp_path: Path) -> None:
    async with _one_bookie(tmp_path, **SMALL_LOGS) as (cluster, bk):
        keep, doomed = await _two_ledgers(bk)
        await bk.delete_ledger(doomed.ledger_id)
        address = str(cluster.bookies[0].address)
        code, out, err = await _aiobk("bookie", "gc", address, "--json")
        assert code == 0, err
        figures = json.loads(out)
        assert figures["ledgers_deleted"] == 1
        assert figures["logs_removed"] >= 4
        assert figures["skipped"] == ""
        assert doomed.ledger_id not in cluster.bookies[0].storage.ledgers
        await _check(keep.ledger_id, bk, 40, b"k")
        code, out, err = await _aiobk("bookie", "gc", "nonsense")
        assert code != 0
        assert "HOST:PORT" in err
        assert len(err.strip().splitlines()) == 1


async def test_gc_needs_a_metadata_store(start_bookie) -> None:
    bookie = await start_bookie()  # no metadata store
    code, _out, err = await _aiobk("bookie", "gc", str(bookie.address))
    assert code != 0
    assert "EBADREQ" in err
    assert "metadata store" in err


async def test_each_gc_pass_compacts_the_metadata_history(tmp_path: Path) -> None:
    """After its GC pass a bookie lets the store forget all but ``metadata_history_revisions``
    revisions (etcd refuses every write once its history fills its quota)."""
    settings = {**SMALL_LOGS, "gc_interval": 0.05, "metadata_history_revisions": 3}
    async with _one_bookie(tmp_path, **settings) as (_cluster, bk):
        store = bk.store
        first = await store.allocate_ledger_id()
        for _ in range(10):
            await store.allocate_ledger_id()
        deadline = asyncio.get_running_loop().time() + 10
        while True:  # until a pass has compacted past the first revision
            watch = await store.kv.watch(store.keys.idgen, prefix=False, start_revision=first)
            try:
                await watch.next(0.05)
            except MetadataStoreError:
                break  # compacted: a watch from there cannot start
            except TimeoutError:
                pass
            finally:
                await watch.close()
            assert asyncio.get_running_loop().time() < deadline, "no GC pass compacted"
            await asyncio.sleep(0.05)
