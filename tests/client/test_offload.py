"""Offloading closed ledgers to an object store (docs/design/tiered-storage.md), on real
in-process bookies and a real directory store: a log offloaded and released reads back whole
with every bookie stopped; a crash at each point of an offload loses nothing and leaves nothing
the work-list upkeep and the sweep do not clear; deletion and truncation take the objects with
them; the bookies drop released ledgers and autorecovery leaves offloaded ones alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, LogPosition, LogRecord
from aiobk.client.errors import DigestMismatchError, ObjectStoreError, UnauthorizedError
from aiobk.client.log.format import decode
from aiobk.client.offload import POINTS, Steps, offload_ledger, sweep, upkeep
from aiobk.client.offload.copy import LedgerOffload
from aiobk.metadata import MetadataStore, OffloadState, OffloadStoreSettings
from aiobk.protocol import DigestType
from aiobk.tiered import MemoryObjectStore
from aiobk.tiered.objects import ledger_prefix
from aiobk.tiered.open import StoreCache, open_object_store
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.s3server import S3Server

HOUR = 3600.0


class Killed(BaseException):
    """A process stopped dead at a point of an offload: no cleanup runs."""


class StopAt(Steps):
    """Raise at ``point``: ``Killed`` (a crash) by default, or a failure the code handles."""

    def __init__(self, point: str, error: BaseException | None = None) -> None:
        self.point = point
        self.error = error

    async def at(self, point: str) -> None:
        if point == self.point:
            raise self.error or Killed(point)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 3)
    try:
        yield cluster
    finally:
        await cluster.stop()


@pytest.fixture(params=["directory", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The cluster's store: a real directory, then a bucket on the session's S3 server."""
    if request.param == "directory":
        (tmp_path / "objects").mkdir()
        return f"file://{tmp_path / 'objects'}"
    server: S3Server = request.getfixturevalue("s3_server")
    return server.bucket_url(unique_name("offload-"), "cluster")


async def set_store(store: MetadataStore, where: Path | str, lag: float = 0.0) -> str:
    """Make ``where`` (a directory, or a store URL) the cluster's store; its URL."""
    if isinstance(where, Path):
        where.mkdir(parents=True, exist_ok=True)
        where = f"file://{where}"
    await store.set_offload_store(OffloadStoreSettings(where, deletion_lag=lag))
    return where


async def write_log(bk: BookKeeper, name: str, ledgers: int, per_ledger: int = 20) -> list[bytes]:
    """A log of ``ledgers`` closed ledgers of ``per_ledger`` records each: each writer that
    takes the log starts a ledger, and closes it when it closes."""
    sent: list[bytes] = []
    for ledger in range(ledgers):
        async with await bk.open_log_writer(name) as writer:
            batch = [b"%d-%d:" % (ledger, i) + b"x" * (i * 37 % 900) for i in range(per_ledger)]
            await asyncio.gather(*(writer.append(record) for record in batch))
        sent += batch
    return sent


async def read_log(bk: BookKeeper, name: str) -> list[bytes]:
    reader = await bk.open_log_reader(name, follow=False)
    records: list[LogRecord] = [record async for record in reader]
    return [record.data for record in records]


async def held_objects(where: Path | str) -> set[str]:
    """The keys of the complete objects in a store (a directory, or a store URL)."""
    store = open_object_store(f"file://{where}" if isinstance(where, Path) else where)
    try:
        return {key async for key in store.keys("ledgers/")}
    finally:
        await store.close()


async def named_objects(store: MetadataStore, ledgers: list[int]) -> set[str]:
    keys = set()
    for ledger_id in ledgers:
        offload = (await store.read_ledger(ledger_id)).offload
        if offload is not None:
            keys.add(offload.key)
    return keys


async def test_a_log_offloaded_reads_back_with_every_bookie_stopped(
    cluster: Cluster, store_url: str
) -> None:
    async with BookKeeper(cluster.uri) as bk:
        await set_store(bk.store, store_url)
        sent = await write_log(bk, "orders", ledgers=3)
        report = await bk.offload_log("orders")
        ledgers = list((await bk.store.read_log("orders")).ledgers)
        assert [item.ledger_id for item in report.ledgers] == ledgers
        assert [item.outcome for item in report.ledgers] == ["released"] * 3
        assert await held_objects(store_url) == await named_objects(bk.store, ledgers)
        again = await bk.offload_log("orders")  # nothing more to do
        assert [item.outcome for item in again.ledgers] == ["done"] * 3
        for bookie in cluster.bookies:
            result = await bookie.collect_garbage(forced=True)
            assert sorted(result.ledgers_released) == sorted(ledgers)
        # The released ledgers read from their objects only.
        await cluster.stop()
        assert await read_log(bk, "orders") == sent
        handle = await bk.open_ledger(ledgers[1])
        entries = await handle.read(0, handle.last_add_confirmed)
        assert len(entries) == 20


async def test_a_copied_ledger_keeps_its_bookie_copies_until_the_lag_has_passed(
    cluster: Cluster, store_url: str
) -> None:
    async with BookKeeper(cluster.uri) as bk:
        await set_store(bk.store, store_url, lag=HOUR)
        sent = await write_log(bk, "audit", ledgers=2)
        handle = await bk.open_ledger((await bk.store.read_log("audit")).ledgers[0])
        report = await bk.offload_log("audit")
        assert [item.outcome for item in report.ledgers[:2]] == ["copied", "copied"]
        for bookie in cluster.bookies:
            assert (await bookie.collect_garbage(forced=True)).ledgers_released == []
        settings = await bk.store.read_offload_store()
        now = time.time()
        early = await upkeep(bk.context, bk.objects, settings, now=lambda: now + 60)
        assert early.released == []
        due = await upkeep(bk.context, bk.objects, settings, now=lambda: now + HOUR + 1)
        assert sorted(due.released) == sorted(item.ledger_id for item in report.ledgers[:2])
        for bookie in cluster.bookies:
            assert len((await bookie.collect_garbage(forced=True)).ledgers_released) == 2
        # A handle opened while the bookies held the ledger turns to the object.
        entries = await handle.read(0, handle.last_add_confirmed)
        assert [decode(entry.data).data for entry in entries] == sent[:20]
        assert await read_log(bk, "audit") == sent


@pytest.mark.parametrize("point", POINTS)
async def test_a_crash_at_any_point_loses_nothing_and_leaves_nothing_behind(
    cluster: Cluster, store_url: str, point: str
) -> None:
    async with BookKeeper(cluster.uri) as bk:
        await set_store(bk.store, store_url)
        sent = await write_log(bk, "crashy", ledgers=2, per_ledger=40)
        ledgers = list((await bk.store.read_log("crashy")).ledgers)
        settings = await bk.store.read_offload_store()
        assert settings is not None
        now = time.time()
        with pytest.raises(Killed):
            await offload_ledger(
                bk.context, bk.objects, settings, ledgers[0], now=lambda: now,
                steps=StopAt(point), block_size=4096,
            )  # fmt: skip
        assert await read_log(bk, "crashy") == sent  # nothing lost, whatever state it is in
        # Later: the upkeep takes back what died, the sweep removes what no metadata names.
        later = now + 2 * HOUR
        await upkeep(bk.context, bk.objects, settings, now=lambda: later)
        await sweep(bk.context, bk.objects.get(settings.url))
        named = await named_objects(bk.store, ledgers)
        assert await held_objects(store_url) == named
        assert not await bk.objects.get(settings.url).uploads("ledgers/")
        listed = [i async for i in bk.store.list_offloading()]
        offloads = {i: (await bk.store.read_ledger(i)).offload for i in ledgers}
        assert set(listed) == {i for i, record in offloads.items() if record is not None}
        # And a later offload completes it.
        done: LedgerOffload = await offload_ledger(
            bk.context, bk.objects, settings, ledgers[0], now=lambda: later
        )
        assert done.outcome in ("released", "done")
        record = (await bk.store.read_ledger(ledgers[0])).offload
        assert record is not None
        assert record.state is OffloadState.RELEASED
        for bookie in cluster.bookies:
            await bookie.collect_garbage(forced=True)
        await cluster.stop()
        handle = await bk.open_ledger(ledgers[0])
        entries = await handle.read(0, handle.last_add_confirmed)
        assert [decode(entry.data).data for entry in entries] == sent[:40]


async def test_deleting_and_truncating_take_the_objects_and_the_sweep_finds_orphans(
    cluster: Cluster, tmp_path: Path
) -> None:
    objects_dir = tmp_path / "objects"
    async with BookKeeper(cluster.uri) as bk:
        await set_store(bk.store, objects_dir)
        await write_log(bk, "short", ledgers=3)
        await bk.offload_log("short")
        ledgers = list((await bk.store.read_log("short")).ledgers)
        assert len(await held_objects(objects_dir)) == 3
        await bk.truncate_log("short", LogPosition(ledgers[2], 0))
        assert await held_objects(objects_dir) == await named_objects(bk.store, ledgers[2:])
        assert [i async for i in bk.store.list_offloading()] == [ledgers[2]]
        # An object a crash left between deleting the metadata and the object.
        store = bk.objects.get(f"file://{objects_dir}")
        orphan = f"ledgers/{ledgers[0]:019d}/{'ab' * 16}.aobk"

        async def chunks() -> AsyncIterator[bytes]:
            yield b"left behind"

        await store.put(orphan, chunks())
        dry = await sweep(bk.context, store, dry_run=True)
        assert dry.objects == [orphan]
        assert orphan in await held_objects(objects_dir)
        swept = await sweep(bk.context, store)
        assert swept.objects == [orphan]
        assert swept.kept == 1
        assert orphan not in await held_objects(objects_dir)
        # The store's URL written another way: named objects are still named (by their keys).
        again = await sweep(bk.context, bk.objects.get(f"file://{objects_dir}/"))
        assert (again.objects, again.kept) == ([], 1)
        await bk.delete_log("short")
        assert await held_objects(objects_dir) == set()
        assert [i async for i in bk.store.list_offloading()] == []
        # A forced delete reads nothing: the offload pass's upkeep takes the object after.
        await write_log(bk, "forced", ledgers=1)
        await bk.offload_log("forced")
        (ledger_id,) = (await bk.store.read_log("forced")).ledgers
        await bk.delete_ledger(ledger_id, force=True)
        assert len(await held_objects(objects_dir)) == 1
        settings = await bk.store.read_offload_store()
        report = await upkeep(bk.context, bk.objects, settings, now=time.time)
        assert report.dropped == [ledger_id]
        assert await held_objects(objects_dir) == set()


async def test_without_a_store_offloading_is_refused_in_one_line(cluster: Cluster) -> None:
    async with BookKeeper(cluster.uri) as bk:
        await write_log(bk, "nowhere", ledgers=1)
        with pytest.raises(Exception, match="no offload store is set") as caught:
            await bk.offload_log("nowhere")
        assert "\n" not in str(caught.value)


async def test_a_mac_ledger_offloaded_without_its_password_reads_back_with_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The offloader checks a MAC ledger's entries by their ids (it lacks the password); a
    reader with the password checks every MAC of the object's copies, and a wrong password is
    refused as it is for a ledger on bookies."""
    async with BookKeeper(cluster.uri) as bk:
        await set_store(bk.store, tmp_path / "objects")
        lh = await bk.create_ledger(3, 3, 2, password=b"secret", digest_type=DigestType.MAC)
        for i in range(30):
            await lh.append(b"mac %d" % i)
        await lh.close()
        settings = await bk.store.read_offload_store()
        assert settings is not None
        with pytest.raises(UnauthorizedError):
            await offload_ledger(
                bk.context, bk.objects, settings, lh.ledger_id, now=time.time, password=b"no"
            )
        done = await offload_ledger(bk.context, bk.objects, settings, lh.ledger_id, now=time.time)
        assert done.outcome == "released"
        for bookie in cluster.bookies:
            await bookie.collect_garbage(forced=True)
        await cluster.stop()
        handle = await bk.open_ledger(lh.ledger_id, b"secret")
        entries = await handle.read(0, 29)
        assert [entry.data for entry in entries] == [b"mac %d" % i for i in range(30)]
        with pytest.raises(UnauthorizedError):
            await bk.open_ledger(lh.ledger_id, b"wrong")


async def test_a_damaged_object_is_a_clear_error_never_wrong_entries(
    cluster: Cluster, tmp_path: Path
) -> None:
    objects_dir = tmp_path / "objects"
    async with BookKeeper(cluster.uri) as bk:
        await set_store(bk.store, objects_dir)
        sent = await write_log(bk, "damaged", ledgers=1)
        await bk.offload_log("damaged")
        (ledger_id,) = (await bk.store.read_log("damaged")).ledgers
        for bookie in cluster.bookies:
            await bookie.collect_garbage(forced=True)
        record = (await bk.store.read_ledger(ledger_id)).offload
        assert record is not None
        path = objects_dir / record.key
        data = bytearray(path.read_bytes())
        data[64 + 16 + 4 + 40] ^= 0xFF  # a byte inside the first entry's payload
        path.write_bytes(bytes(data))
        handle = await bk.open_ledger(ledger_id)
        with pytest.raises(DigestMismatchError) as caught:
            await handle.read(0, len(sent) - 1)
        assert "\n" not in str(caught.value)
        assert (await handle.read(5, 6))[0].entry_id == 5  # the rest still reads


async def test_a_failed_offload_is_taken_back_at_once_and_an_empty_ledger_offloads(
    cluster: Cluster, tmp_path: Path
) -> None:
    objects_dir = tmp_path / "objects"
    async with BookKeeper(cluster.uri) as bk:
        await set_store(bk.store, objects_dir)
        await write_log(bk, "flaky", ledgers=1, per_ledger=60)
        (ledger_id,) = (await bk.store.read_log("flaky")).ledgers
        settings = await bk.store.read_offload_store()
        assert settings is not None
        with pytest.raises(ObjectStoreError):
            await offload_ledger(
                bk.context, bk.objects, settings, ledger_id, now=time.time,
                steps=StopAt("uploading", ObjectStoreError("the store went away")), block_size=4096,
            )  # fmt: skip
        assert (await bk.store.read_ledger(ledger_id)).offload is None
        assert await held_objects(objects_dir) == set()
        assert [i async for i in bk.store.list_offloading()] == []
        retried = await offload_ledger(bk.context, bk.objects, settings, ledger_id, now=time.time)
        assert retried.outcome == "released"  # not "busy": nothing waits to go stale
        empty = await bk.create_ledger(3, 3, 2)
        await empty.close()
        done = await offload_ledger(
            bk.context, bk.objects, settings, empty.ledger_id, now=time.time
        )
        assert (done.outcome, done.entries) == ("released", 0)
        for bookie in cluster.bookies:
            await bookie.collect_garbage(forced=True)
        handle = await bk.open_ledger(empty.ledger_id)
        assert handle.last_add_confirmed == -1


async def test_a_ledger_that_fails_does_not_stop_the_others(cluster: Cluster) -> None:
    """One ledger's store failure: the log's other ledgers are offloaded all the same, then
    the failure is raised as itself (not wrapped), and the failed ledger is left as it was."""
    async with BookKeeper(cluster.uri) as bk:
        await write_log(bk, "mixed", ledgers=3)
        ledgers = list((await bk.store.read_log("mixed")).ledgers)
        refused = ledger_prefix(ledgers[1])

        class Refusing(MemoryObjectStore):
            async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
                if key.startswith(refused):
                    raise ObjectStoreError("the store refused the put")
                return await super().put(key, chunks)

        store = Refusing("file:///refusing")
        bk.objects = StoreCache(lambda url: store)
        await bk.store.set_offload_store(OffloadStoreSettings("file:///refusing", 0))
        with pytest.raises(ObjectStoreError, match="refused the put"):
            await bk.offload_log("mixed")
        states = [(await bk.store.read_ledger(i)).offload for i in ledgers]
        assert [None if s is None else s.state for s in states] == [
            OffloadState.RELEASED, None, OffloadState.RELEASED,
        ]  # fmt: skip
        assert sorted(store.objects) == sorted(s.key for s in states if s is not None)
