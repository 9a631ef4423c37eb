"""A metadata store outage during an ensemble change: the change retries
for ``metadata_retry_timeout`` with acknowledgements held, then fails the ledger. Component
tests on fake bookies with a store that can be switched off, then the real thing: etcd stopped,
a bookie killed, etcd started again on the same port and data."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookKeeper, ClientConfig
from aiobk.client.errors import MetadataStoreError
from aiobk.metadata import EtcdProcess, MetadataStore
from tests.support.cluster import start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until


class Outage:
    """Switches a store's ledger and registry calls to ``MetadataStoreError`` (an unreachable
    etcd, as its client reports one) and counts the calls refused meanwhile."""

    CALLS = ("list_bookies", "read_ledger", "write_ledger")

    def __init__(self, store: MetadataStore) -> None:
        self.down = False
        self.refused = 0
        for name in self.CALLS:
            setattr(store, name, self._wrap(getattr(store, name)))

    def _wrap(self, call: Any) -> Any:
        async def maybe(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.refused += 1
                raise MetadataStoreError("etcd 127.0.0.1:2379 is unreachable (test outage)")
            return await call(*args, **kwargs)

        return maybe


async def test_ensemble_change_rides_out_a_metadata_outage(world) -> None:
    bookies = await world.bookies(4)
    outage = Outage(world.store)
    bk = await world.client(metadata_retry_timeout=30.0)
    lh = await bk.create_ledger(3, 3, 2)
    for i in range(5):
        assert await lh.append(b"before %d" % i) == i
    victim = next(b for b in bookies if b.bookie_id == lh.metadata.ensemble[0])
    outage.down = True
    victim.crash()
    # Entry 5 finds the victim gone (it may still be acknowledged by the two others if
    # their answers come first: the change starts when the failure is known).
    first = asyncio.ensure_future(lh.append(b"during 0"))
    await wait_until(lambda: outage.refused >= 3, every=0)  # the change is retrying the store
    during = [asyncio.ensure_future(lh.append(b"during %d" % i)) for i in range(1, 10)]
    refused = outage.refused
    await wait_until(lambda: outage.refused >= refused + 3, every=0)  # more retries, with backoff
    assert not any(t.done() for t in during)  # held, not failed
    assert lh.error is None
    outage.down = False
    assert await asyncio.gather(first, *during) == list(range(5, 15))
    assert await lh.append(b"after") == 15
    assert victim.bookie_id not in lh.metadata.ensemble
    assert [f.first_entry_id for f in lh.metadata.fragments] in ([0, 5], [0, 6])
    await lh.close()
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    expected = [b"before %d" % i for i in range(5)] + [b"during %d" % i for i in range(10)]
    assert [e.data for e in await rh.read(0, 15)] == [*expected, b"after"]


async def test_metadata_outage_past_the_timeout_fails_the_ledger(world) -> None:
    bookies = await world.bookies(4)
    outage = Outage(world.store)
    bk = await world.client(metadata_retry_timeout=0.5)
    lh = await bk.create_ledger(3, 3, 2)
    assert await lh.append(b"kept") == 0
    outage.down = True
    next(b for b in bookies if b.bookie_id == lh.metadata.ensemble[1]).crash()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(MetadataStoreError, match="metadata_retry_timeout"):
        await lh.append(b"lost")
    waited = loop.time() - started
    assert 0.45 <= waited < 5.0  # it retried for the timeout, then gave up promptly
    assert outage.refused >= 3
    with pytest.raises(MetadataStoreError):
        await lh.append(b"later")  # the ledger stays failed
    outage.down = False
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)  # recovery keeps what was acknowledged
    assert rh.last_add_confirmed >= 0
    assert [e.data for e in await rh.read(0, 0)] == [b"kept"]


async def test_close_rides_out_a_metadata_outage(world) -> None:
    await world.bookies(3)
    outage = Outage(world.store)
    bk = await world.client(metadata_retry_timeout=30.0)
    lh = await bk.create_ledger(3, 3, 2)
    await lh.append(b"x")
    outage.down = True
    closing = asyncio.ensure_future(lh.close())
    await wait_until(lambda: outage.refused >= 2, every=0)
    assert not closing.done()
    outage.down = False
    await closing
    assert lh.metadata.is_closed
    assert lh.metadata.last_entry_id == 0


async def test_creating_a_ledger_rides_out_a_metadata_outage(world) -> None:
    """A log writer's roll creates a ledger: an etcd blip must not fail it (found by the
    multi-host test)."""
    await world.bookies(3)
    bk = await world.client(metadata_retry_timeout=30.0)
    store = world.store
    calls = {"allocate_ledger_id": 0, "create_ledger": 0}
    real = {name: getattr(store, name) for name in calls}
    down = {"on": True}

    def wrap(name: str) -> Any:
        async def maybe(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            if down["on"] and calls[name] <= 2:
                raise MetadataStoreError("etcd 127.0.0.1:2379 is unreachable (test outage)")
            return await real[name](*args, **kwargs)

        return maybe

    for name in calls:
        setattr(store, name, wrap(name))
    lh = await bk.create_ledger(3, 3, 2)
    assert calls == {"allocate_ledger_id": 3, "create_ledger": 3}
    assert await lh.append(b"x") == 0


async def test_a_create_whose_answer_was_lost_is_recognised_as_ours(world) -> None:
    """The first attempt landed and its answer was lost: the retry finds the id taken by the
    very metadata it wrote, and keeps it (no orphan ledger, no second id)."""
    await world.bookies(3)
    bk = await world.client(metadata_retry_timeout=30.0)
    store = world.store
    real_create = store.create_ledger
    attempts = []

    async def lossy(ledger_id: int, metadata: Any) -> Any:
        attempts.append(ledger_id)
        created = await real_create(ledger_id, metadata)
        if len(attempts) == 1:
            raise MetadataStoreError("etcd 127.0.0.1:2379 did not answer create (test)")
        return created

    store.create_ledger = lossy
    lh = await bk.create_ledger(3, 3, 2)
    assert attempts == [lh.ledger_id, lh.ledger_id]
    assert [i async for i in bk.list_ledgers()] == [lh.ledger_id]
    assert await lh.append(b"x") == 0


async def test_a_log_roll_rides_out_a_metadata_outage(world) -> None:
    await world.bookies(3)
    bk = await world.client(metadata_retry_timeout=30.0)
    writer = await bk.open_log_writer("blip", roll_bytes=4)  # a roll after each append
    first_ledger = writer.ledger_id
    store = world.store
    real_write = store.write_log
    failures = {"left": 2}

    async def flaky(record: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise MetadataStoreError("etcd 127.0.0.1:2379 is unreachable (test outage)")
        return await real_write(record)

    store.write_log = flaky
    await writer.append(b"first")  # its roll meets the outage
    position = await writer.append(b"second")  # waits for the roll, which rides out the blip
    assert failures["left"] == 0
    assert position.ledger_id != first_ledger
    await writer.close()
    assert (await store.read_log("blip")).ledgers[:2] == (first_ledger, position.ledger_id)


# ---------------------------------------------------------------------------- real etcd


@pytest.fixture
def own_etcd() -> Iterator[EtcdProcess]:
    """An etcd of this test's own: stopping it must not disturb the session's."""
    server = EtcdProcess().start()
    yield server
    server.stop()


@pytest.mark.timeout(180)
async def test_etcd_down_then_a_bookie_dies_then_etcd_returns(own_etcd, tmp_path: Path) -> None:
    uri = own_etcd.uri(unique_name("etcdblip"))
    cluster = await start_cluster(tmp_path, 4, uri=uri)
    config = ClientConfig(add_timeout=5.0, metadata_timeout=2.0, metadata_retry_timeout=60.0)
    try:
        async with await BookKeeper.connect(uri, config) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            acked = [await lh.append(b"a%d" % i) for i in range(50)]
            await asyncio.to_thread(own_etcd.stop, remove_data=False)
            victim = cluster.by_id(lh.metadata.ensemble[2])
            await victim.crash()
            # The client learns of the crash from an add to the dead bookie; the appends sent
            # once it has (its ensemble change under way, held by etcd) must wait. Sent at
            # once instead, a loaded machine could let the live bookies acknowledge them all
            # before the failure was seen.
            pending = [asyncio.ensure_future(lh.append(b"b0"))]
            await wait_until(
                lambda: lh._pipeline.changing, timeout=10, what="an ensemble change under way"
            )
            pending += [asyncio.ensure_future(lh.append(b"b%d" % i)) for i in range(1, 50)]
            await asyncio.sleep(3.0)  # the change keeps failing to reach etcd meanwhile
            # Those acknowledged before the failure was known are done; the rest are held.
            assert not all(t.done() for t in pending)
            assert all(t.exception() is None for t in pending if t.done())
            assert lh.error is None
            await asyncio.to_thread(own_etcd.start)  # same port, same data directory
            async with asyncio.timeout(60):
                acked += await asyncio.gather(*pending)
            acked.append(await lh.append(b"c"))
            assert acked == list(range(101))
            assert victim.bookie_id not in lh.metadata.ensemble
            await asyncio.to_thread(own_etcd.restart)  # a plain blip: nothing to ride out
            acked.append(await lh.append(b"d"))
            await lh.close()
        async with await BookKeeper.connect(uri) as bk:
            rh = await bk.open_ledger(lh.ledger_id)
            data = [e.data for e in await rh.read(0, rh.last_add_confirmed)]
        expected = [b"a%d" % i for i in range(50)] + [b"b%d" % i for i in range(50)]
        assert data == [*expected, b"c", b"d"]
    finally:
        if not own_etcd.running:
            await asyncio.to_thread(own_etcd.start)
        await cluster.stop()


@pytest.mark.timeout(120)
async def test_etcd_down_past_the_timeout_fails_the_ledger(own_etcd, tmp_path: Path) -> None:
    uri = own_etcd.uri(unique_name("etcdgone"))
    cluster = await start_cluster(tmp_path, 4, uri=uri)
    config = ClientConfig(add_timeout=5.0, metadata_timeout=2.0, metadata_retry_timeout=3.0)
    try:
        async with await BookKeeper.connect(uri, config) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            await lh.append(b"kept")
            await asyncio.to_thread(own_etcd.stop, remove_data=False)
            await cluster.by_id(lh.metadata.ensemble[0]).crash()
            loop = asyncio.get_running_loop()
            started = loop.time()
            # The first append finds the bookie gone (the two others may still acknowledge it);
            # one made while the change is stuck is held, then fails with the ledger.
            first = asyncio.ensure_future(lh.append(b"finds the bookie gone"))
            await wait_until(lambda: lh._pipeline.changing, what="the ensemble change is stuck")
            with pytest.raises(MetadataStoreError, match="metadata_retry_timeout"):
                await lh.append(b"held, then failed")
            waited = loop.time() - started
            # Retried for the timeout; at most one store call's timeout more, then failed.
            assert 2.9 <= waited < 3.0 + 2.0 + 3.0
            assert isinstance(lh.error, MetadataStoreError)
            await asyncio.gather(first, return_exceptions=True)
            with contextlib.suppress(MetadataStoreError):
                await lh.close()
    finally:
        if not own_etcd.running:
            await asyncio.to_thread(own_etcd.start)
        await cluster.stop()
