"""One contract for every metadata store: memory:// and a real etcd pass the same tests."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.metadata import (
    READ_ONLY,
    BookieServiceInfo,
    Cookie,
    Fragment,
    LedgerMetadata,
    LedgerState,
    MetadataStore,
)
from aiobk.protocol.errors import (
    BookieAlreadyRegisteredError,
    LedgerExistsError,
    LogExistsError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchLedgerError,
    NoSuchLogError,
)
from tests.support.wait import wait_until

ENSEMBLE = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


def ledger(**changes: object) -> LedgerMetadata:
    base = LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),), custom_metadata={"app": b"t"})
    return base.replace(**changes) if changes else base


async def test_create_read_and_compare_and_set(store: MetadataStore) -> None:
    ledger_id = await store.allocate_ledger_id()
    created = await store.create_ledger(ledger_id, ledger())
    assert created.version > 0
    read = await store.read_ledger(ledger_id)
    assert read == ledger()
    assert read.version == created.version
    with pytest.raises(LedgerExistsError):
        await store.create_ledger(ledger_id, ledger())
    recovering = await store.write_ledger(ledger_id, read.in_recovery())
    assert recovering.version > read.version
    assert recovering.state is LedgerState.IN_RECOVERY
    with pytest.raises(MetadataVersionError):
        await store.write_ledger(ledger_id, read.closed(5, 100))  # stale version
    closed = await store.write_ledger(ledger_id, recovering.closed(5, 100))
    assert (await store.read_ledger(ledger_id)).last_entry_id == 5
    assert closed.is_closed


async def test_missing_ledgers(store: MetadataStore) -> None:
    with pytest.raises(NoSuchLedgerError):
        await store.read_ledger(424242)
    with pytest.raises(NoSuchLedgerError):
        await store.write_ledger(424242, ledger().with_version(3))
    with pytest.raises(NoSuchLedgerError):
        await store.delete_ledger(424242)


async def test_versioned_delete(store: MetadataStore) -> None:
    ledger_id = await store.allocate_ledger_id()
    created = await store.create_ledger(ledger_id, ledger())
    with pytest.raises(MetadataVersionError):
        await store.delete_ledger(ledger_id, created.version + 1000)
    await store.delete_ledger(ledger_id, created.version)
    with pytest.raises(NoSuchLedgerError):
        await store.read_ledger(ledger_id)


async def test_ids_are_unique_and_increasing(store: MetadataStore) -> None:
    ids = [await store.allocate_ledger_id() for _ in range(20)]
    assert ids == sorted(set(ids))
    concurrent = await asyncio.gather(*(store.allocate_ledger_id() for _ in range(50)))
    assert len(set(concurrent) | set(ids)) == 70


async def test_list_streams_in_id_order_across_pages(store: MetadataStore) -> None:
    ids = [await store.allocate_ledger_id() for _ in range(23)]
    for ledger_id in ids:
        await store.create_ledger(ledger_id, ledger())
    listed = [i async for i in store.list_ledgers(page_size=5)]
    assert listed == sorted(ids)


async def test_list_walks_sparse_and_dense_ids_and_ids_past_the_revision(
    store: MetadataStore,
) -> None:
    """The listing walks id windows up to the store's revision (etcd 3.4 counts a whole range
    per page otherwise), widening and narrowing them: gaps, runs fuller than a page, and
    ledgers made with ids of their own choosing (beyond any revision) all come back, once."""
    allocated = [await store.allocate_ledger_id() for _ in range(60)]
    chosen = [10**9 + 7, 10**9 + 8, 2**62]
    ids = allocated[:20] + allocated[25::7] + chosen  # a dense run, gaps, far ids
    for ledger_id in ids:
        await store.create_ledger(ledger_id, ledger())
    for page_size in (1, 4, 1000):
        listed = [i async for i in store.list_ledgers(page_size=page_size)]
        assert listed == sorted(ids), page_size


async def test_update_helper_loses_no_concurrent_update(store: MetadataStore) -> None:
    ledger_id = await store.allocate_ledger_id()
    await store.create_ledger(ledger_id, ledger())

    async def bump() -> None:
        await store.update_ledger(ledger_id, lambda md: md.replace(length=md.length + 1))

    await asyncio.gather(*(bump() for _ in range(10)))
    assert (await store.read_ledger(ledger_id)).length == 10
    unchanged = await store.update_ledger(ledger_id, lambda md: None)
    assert unchanged.length == 10


async def test_watch_ledger_sees_changes_and_delete(store: MetadataStore) -> None:
    ledger_id = await store.allocate_ledger_id()
    created = await store.create_ledger(ledger_id, ledger())
    updates = store.watch_ledger(ledger_id)
    first = await asyncio.wait_for(anext(updates), 10)
    assert first == created
    written = await store.write_ledger(ledger_id, created.in_recovery())
    second = await asyncio.wait_for(anext(updates), 10)
    assert second is not None
    assert second.state is LedgerState.IN_RECOVERY
    assert second.version == written.version
    await store.delete_ledger(ledger_id)
    assert await asyncio.wait_for(anext(updates), 10) is None
    await updates.aclose()


def _info(bookie_id: str, **kw: object) -> BookieServiceInfo:
    return BookieServiceInfo(bookie_id, bookie_id, software_version="test", **kw)  # type: ignore[arg-type]


async def test_bookie_registry(store: MetadataStore) -> None:
    first = await store.register_bookie(_info("127.0.0.1:4001", free_bytes=10), ttl=5)
    second = await store.register_bookie(_info("127.0.0.1:4002", state=READ_ONLY), ttl=5)
    listed = await store.list_bookies()
    assert [b.bookie_id for b in listed] == ["127.0.0.1:4001", "127.0.0.1:4002"]
    assert listed[0].free_bytes == 10
    writable = await store.list_bookies(writable_only=True)
    assert [b.bookie_id for b in writable] == ["127.0.0.1:4001"]
    with pytest.raises(BookieAlreadyRegisteredError, match="already registered"):
        await store.register_bookie(_info("127.0.0.1:4001"), ttl=5)
    await first.update(_info("127.0.0.1:4001", free_bytes=99))
    assert (await store.list_bookies())[0].free_bytes == 99
    await first.close()
    await second.close()
    assert await store.list_bookies() == []
    again = await store.register_bookie(_info("127.0.0.1:4001"), ttl=5)  # free after close
    await again.close()


async def test_a_restarted_bookie_takes_over_its_own_registration(store: MetadataStore) -> None:
    old = await store.register_bookie(_info("127.0.0.1:4050", instance_id="disk-1"), ttl=30)
    await old.abandon()  # crashed: its lease is still live for a while
    with pytest.raises(BookieAlreadyRegisteredError, match="another live process"):
        await store.register_bookie(_info("127.0.0.1:4050", instance_id="disk-2"), ttl=30)
    new = await store.register_bookie(_info("127.0.0.1:4050", instance_id="disk-1"), ttl=30)
    (listed,) = await store.list_bookies()
    assert listed.instance_id == "disk-1"
    await new.close()
    assert await store.list_bookies() == []


async def test_watch_bookies(store: MetadataStore) -> None:
    updates = store.watch_bookies()
    assert await asyncio.wait_for(anext(updates), 10) == []
    registration = await store.register_bookie(_info("127.0.0.1:4100"), ttl=5)
    seen = await asyncio.wait_for(anext(updates), 10)
    assert [b.bookie_id for b in seen] == ["127.0.0.1:4100"]
    await registration.close()
    assert await asyncio.wait_for(anext(updates), 10) == []
    await updates.aclose()


@pytest.mark.timeout(60)
async def test_dead_bookie_disappears_when_its_lease_expires(store: MetadataStore) -> None:
    registration = await store.register_bookie(_info("127.0.0.1:4200"), ttl=2)
    await registration.abandon()  # the process died: nobody refreshes the lease

    async def gone() -> bool:
        return await store.list_bookies() == []

    await wait_until(gone, every=0.2, timeout=20, what="the bookie's lease expired")


@pytest.mark.timeout(60)
async def test_bookie_leases_say_how_long_since_a_bookie_was_heard_from(
    store: MetadataStore,
) -> None:
    live = await store.register_bookie(_info("127.0.0.1:4300"), ttl=4)
    silent = await store.register_bookie(_info("127.0.0.1:4301"), ttl=4)
    await silent.abandon()  # no more refreshes, as after SIGKILL
    await asyncio.sleep(2.2)
    heard = await store.bookie_leases()
    live_age, live_ttl = heard["127.0.0.1:4300"]
    silent_age, _ttl = heard["127.0.0.1:4301"]
    assert live_ttl == 4
    assert live_age <= 4 / 3 + 1  # refreshed every third of its TTL (etcd: whole seconds)
    assert silent_age >= 2
    await live.close()
    assert "127.0.0.1:4300" not in await store.bookie_leases()


@pytest.mark.timeout(60)
async def test_lease_loss_is_reported_to_the_owner(store: MetadataStore) -> None:
    registration = await store.register_bookie(_info("127.0.0.1:4300"), ttl=2)
    reported: list[str] = []
    registration.on_lost(lambda r: reported.append(r.info.bookie_id))
    await store.kv.revoke_lease(registration.lease)  # as if it expired behind the owner's back
    await asyncio.wait_for(registration.lost.wait(), 20)
    assert reported == ["127.0.0.1:4300"]
    await registration.close()


async def test_cookies(store: MetadataStore) -> None:
    assert await store.read_cookie("127.0.0.1:5000") is None
    cookie = Cookie("127.0.0.1:5000", "127.0.0.1:5000", ("/j",), ("/d",), "instance-1")
    created = await store.write_cookie(cookie)
    assert await store.read_cookie("127.0.0.1:5000") == cookie
    with pytest.raises(MetadataVersionError):
        await store.write_cookie(cookie)  # create again
    changed = Cookie(
        cookie.bookie_id, cookie.address, ("/j2",), ("/d",), "instance-2", created.version
    )
    updated = await store.write_cookie(changed)
    with pytest.raises(MetadataVersionError):
        await store.write_cookie(changed)  # stale version
    with pytest.raises(MetadataVersionError):
        await store.delete_cookie("127.0.0.1:5000", created.version)
    await store.delete_cookie("127.0.0.1:5000", updated.version)
    assert await store.read_cookie("127.0.0.1:5000") is None


async def test_logs(store: MetadataStore) -> None:
    record = await store.create_log("orders")
    assert record.ledgers == ()
    with pytest.raises(LogExistsError):
        await store.create_log("orders")
    grown = await store.write_log(record.with_ledgers((7, 9)))
    with pytest.raises(MetadataVersionError):
        await store.write_log(record.with_ledgers((8,)))  # lost race: someone else appended
    assert (await store.read_log("orders")).ledgers == (7, 9)
    await store.create_log("audit")
    assert [n async for n in store.list_logs()] == ["audit", "orders"]
    updates = store.watch_log("orders")
    assert (await asyncio.wait_for(anext(updates), 10)).ledgers == (7, 9)  # type: ignore[union-attr]
    await store.write_log(grown.with_ledgers((7, 9, 11)))
    assert (await asyncio.wait_for(anext(updates), 10)).ledgers == (7, 9, 11)  # type: ignore[union-attr]
    await updates.aclose()
    await store.delete_log("orders")
    with pytest.raises(NoSuchLogError):
        await store.read_log("orders")
    with pytest.raises(ValueError, match="log name"):
        await store.create_log("bad/name")


async def test_history_is_compacted_behind_what_watches_need(store: MetadataStore) -> None:
    """etcd keeps every revision until compacted (and stops taking writes at its quota): the
    store compacts all but the last ``keep`` revisions. A watch from before that fails (its
    owner reads again); watches from a fresh read work as before; compacting to an older
    revision than already done is a no-op."""
    first = await store.allocate_ledger_id()
    key = store.keys.ledger(first)
    await store.create_ledger(first, ledger())
    for _ in range(5):
        await store.allocate_ledger_id()
    assert await store.compact_history(keep=1_000_000) == 0  # nothing that old yet
    compacted = await store.compact_history(keep=2)
    assert compacted > first
    assert await store.compact_history(keep=4) == compacted - 2  # older: nothing happens
    stale = await store.kv.watch(key, prefix=False, start_revision=first)
    with pytest.raises(MetadataStoreError):
        await stale.next(10)
    await stale.close()
    updates = store.watch_ledger(first)  # from a fresh read: unaffected
    assert (await asyncio.wait_for(anext(updates), 10)) is not None
    await store.delete_ledger(first)
    assert await asyncio.wait_for(anext(updates), 10) is None
    await updates.aclose()
