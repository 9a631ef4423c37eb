"""A watcher whose watch falls behind the store's compaction reads again and carries on
(the bookies compact etcd's history after each GC pass, and ``aiobk standalone``'s
etcd compacts by itself).

etcd cancels a watch that asks for compacted history: one whose stream broke (an etcd restart,
a network cut) and that resumes from a revision compacted meanwhile. The store's watches
(``watch_ledger``, ``watch_log``, ``watch_bookies``) then read the key again and watch on from
there. They used to end with a ``MetadataStoreError``: a tailing ``LogReader`` waiting for its
log's next ledger failed with it, and a ``ReadHandle`` following a ledger lost its watch for
the close (noticing it only when a long poll ran out).

Both twins: the watch is compacted away between the watcher's read and its watch. A real etcd
behind a TCP proxy: the watch's stream is cut, the ledger (or log) changes and etcd compacts
past the change while it is cut, then the stream comes back -- mid-watch, as it happens."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, LogReader, LogRecord
from aiobk.metadata import (
    BookieServiceInfo,
    EtcdProcess,
    Fragment,
    LedgerMetadata,
    LedgerState,
    MetadataStore,
    Watch,
    open_store,
)
from aiobk.metadata.kv import WatchCompactedError
from tests.chaos.proxy import Proxy
from tests.support.cluster import start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(60)

ENSEMBLE = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
METADATA = LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),))


def compacting_before_the_watch(
    monkeypatch: pytest.MonkeyPatch, store: MetadataStore, meanwhile: Callable[[], Awaitable[None]]
) -> list[int]:
    """The store's next ``kv.watch`` first runs ``meanwhile`` (a change to the watched key),
    then compacts the history past it: the watch asks for changes that are gone. Returns the
    revisions compacted to (one entry once it has happened)."""
    kv = store.kv
    original = kv.watch
    compacted: list[int] = []

    async def watch(key: bytes, *, prefix: bool, start_revision: int) -> Watch:
        if not compacted:
            await meanwhile()
            for _ in range(3):  # the history moves on past the change
                await store.allocate_ledger_id()
            compacted.append(await store.compact_history(keep=1))
        return await original(key, prefix=prefix, start_revision=start_revision)

    monkeypatch.setattr(kv, "watch", watch)
    return compacted


async def test_a_ledger_watcher_whose_change_was_compacted_away_reads_again(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger_id = await store.allocate_ledger_id()
    created = await store.create_ledger(ledger_id, METADATA)
    closed: list[LedgerMetadata] = []

    async def close() -> None:
        closed.append(await store.write_ledger(ledger_id, created.closed(9, 1000)))

    compacted = compacting_before_the_watch(monkeypatch, store, close)
    updates = store.watch_ledger(ledger_id)
    try:
        assert await asyncio.wait_for(anext(updates), 10) == created  # read before the close
        assert compacted
        assert compacted[0] > closed[0].version  # the close's event is gone
        seen = await asyncio.wait_for(anext(updates), 10)
        assert seen == closed[0]
        assert seen.state is LedgerState.CLOSED
        assert seen.version == closed[0].version
        await store.delete_ledger(ledger_id)  # and the new watch follows on
        assert await asyncio.wait_for(anext(updates), 10) is None
    finally:
        await updates.aclose()


async def test_a_log_watcher_whose_change_was_compacted_away_reads_again(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique_name("log")
    record = await store.create_log(name)

    async def roll() -> None:
        await store.write_log(record.with_ledgers((7,)))

    compacting_before_the_watch(monkeypatch, store, roll)
    updates = store.watch_log(name)
    try:
        assert await asyncio.wait_for(anext(updates), 10) == record
        rolled = await asyncio.wait_for(anext(updates), 10)
        assert rolled is not None
        assert rolled.ledgers == (7,)
        current = await store.read_log(name)
        await store.write_log(current.with_ledgers((7, 8)))
        later = await asyncio.wait_for(anext(updates), 10)
        assert later is not None
        assert later.ledgers == (7, 8)
    finally:
        await updates.aclose()


async def test_a_bookie_watcher_whose_change_was_compacted_away_reads_again(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    registrations = []

    async def register() -> None:
        registrations.append(
            await store.register_bookie(BookieServiceInfo("127.0.0.1:4181", "127.0.0.1:4181"))
        )

    compacting_before_the_watch(monkeypatch, store, register)
    updates = store.watch_bookies()
    try:
        assert await asyncio.wait_for(anext(updates), 10) == []  # read before the register
        again = await asyncio.wait_for(anext(updates), 10)
        assert [b.bookie_id for b in again] == ["127.0.0.1:4181"]
    finally:
        await updates.aclose()
        for registration in registrations:
            await registration.close()


# ---------------------------------------------------------------------- mid-watch, real etcd


@pytest.fixture
async def cut_off(tmp_path: Path) -> AsyncIterator[tuple[EtcdProcess, Proxy]]:
    """An etcd of the test's own and a TCP proxy in front of it (``hold`` + ``reset``: the
    connections through it break and new ones wait until ``heal``)."""
    etcd = EtcdProcess(data_dir=str(tmp_path / "etcd")).start()
    proxy = Proxy(etcd.client_port)
    await proxy.start()
    try:
        yield etcd, proxy
    finally:
        await proxy.stop()
        await asyncio.to_thread(etcd.stop)


@pytest.mark.timeout(60)
async def test_a_ledger_watch_cut_off_while_etcd_compacts_past_the_close_still_sees_it(
    cut_off: tuple[EtcdProcess, Proxy],
) -> None:
    etcd, proxy = cut_off
    writer = open_store(etcd.uri("midwatch"))
    watcher = open_store(f"etcd://{proxy.address}/midwatch")
    updates = None
    try:
        ledger_id = await writer.allocate_ledger_id()
        created = await writer.create_ledger(ledger_id, METADATA)
        updates = watcher.watch_ledger(ledger_id)
        assert await asyncio.wait_for(anext(updates), 10) == created
        probed = await writer.write_ledger(ledger_id, created)
        assert await asyncio.wait_for(anext(updates), 10) == probed  # the watch's stream is up

        proxy.hold()
        proxy.reset()  # the stream breaks; it retries into the held proxy
        closed = await writer.write_ledger(ledger_id, probed.closed(41, 4200))
        for _ in range(3):
            await writer.allocate_ledger_id()
        assert await writer.compact_history(keep=1) > closed.version
        proxy.heal()  # the watch resumes from before the close: compacted

        seen = await asyncio.wait_for(anext(updates), 30)
        assert seen == closed
        assert seen.state is LedgerState.CLOSED
        assert seen.last_entry_id == 41

        await writer.delete_ledger(ledger_id)  # the watch goes on after reading again
        assert await asyncio.wait_for(anext(updates), 10) is None
    finally:
        if updates is not None:
            await updates.aclose()
        await watcher.close()
        await writer.close()


async def _take(reader: LogReader, count: int, out: list[LogRecord]) -> list[LogRecord]:
    async for record in reader:
        out.append(record)
        if len(out) == count:
            break
    return out


@pytest.mark.timeout(90)
async def test_a_tailing_log_reader_cut_off_while_etcd_compacts_past_the_roll_carries_on(
    cut_off: tuple[EtcdProcess, Proxy], tmp_path: Path
) -> None:
    """The user-visible case: a reader at the end of a log waits (on a watch of the log) for a
    writer to add a ledger. Its etcd connection is cut, a writer adds the ledger and appends,
    etcd compacts past the roll, the connection comes back: the reader reads the new records
    (it used to fail with "watch ... fell behind")."""
    etcd, proxy = cut_off
    cluster = await start_cluster(tmp_path, 3, uri=etcd.uri("logtail"))
    name = unique_name("log")
    reading: asyncio.Future[list[LogRecord]] | None = None
    try:
        async with (
            await BookKeeper.connect(cluster.uri) as writing,
            await BookKeeper.connect(f"etcd://{proxy.address}/logtail") as tailing,
        ):
            first = await writing.open_log_writer(name)
            for i in range(3):
                await first.append(b"before-%d" % i)
            await first.close()
            reader = await tailing.open_log_reader(name)
            taken: list[LogRecord] = []
            reading = asyncio.ensure_future(_take(reader, 6, taken))
            await wait_until(
                lambda: len(taken) == 3 or reading.done(),
                timeout=20,
                what="the closed ledger read",
            )
            # An absence window: it waits on its watch of the log, and nothing more arrives.
            await asyncio.sleep(0.3)
            assert len(taken) == 3
            assert not reading.done()

            proxy.hold()
            proxy.reset()
            second = await writing.open_log_writer(name)  # adds a ledger to the log
            for i in range(3):
                await second.append(b"after-%d" % i)
            for _ in range(3):
                await writing.store.allocate_ledger_id()
            assert await writing.store.compact_history(keep=1) > 0
            proxy.heal()

            records = await asyncio.wait_for(reading, 30)
            assert [r.data for r in records] == [
                b"before-0", b"before-1", b"before-2", b"after-0", b"after-1", b"after-2",
            ]  # fmt: skip
            await second.close()
    finally:
        if reading is not None and not reading.done():
            reading.cancel()
            with contextlib.suppress(BaseException):
                await reading
        await cluster.stop()


def test_the_typed_error_is_a_metadata_store_error() -> None:
    """Callers that catch ``MetadataStoreError`` from a raw ``KV.watch`` still do."""
    from aiobk.protocol.errors import MetadataStoreError

    assert issubclass(WatchCompactedError, MetadataStoreError)
    assert WatchCompactedError.retriable
