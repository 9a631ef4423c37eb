"""Offloading's records in a store, memory:// and a real etcd alike: the cluster's offload store,
the work list, a log's policy, and a ledger's offload record moved by compare-and-set through
``update_ledger`` -- where a stale version loses and every other update keeps the record."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from aiobk.metadata import (
    Fragment,
    LedgerMetadata,
    LogMetadata,
    MetadataStore,
    OffloadPolicy,
    OffloadRecord,
    OffloadState,
    OffloadStoreSettings,
)
from aiobk.metadata.kv import KeyValue
from aiobk.protocol.errors import MetadataVersionError, NoSuchLogError

ENSEMBLE = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


def copying(uid: str, ledger_id: int) -> OffloadRecord:
    return OffloadRecord(
        uid, "file:///srv/offload", f"ledgers/{ledger_id:019d}/{uid}.aobk",
        OffloadState.COPYING, 1_000,
    )  # fmt: skip


async def closed_ledger(store: MetadataStore) -> tuple[int, LedgerMetadata]:
    ledger_id = await store.allocate_ledger_id()
    created = await store.create_ledger(
        ledger_id, LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),))
    )
    return ledger_id, await store.write_ledger(ledger_id, created.closed(9, 1000))


async def test_the_offload_store_record(store: MetadataStore) -> None:
    assert await store.read_offload_store() is None
    first = OffloadStoreSettings("file:///srv/offload", set_at=5)
    await store.set_offload_store(first)
    read = await store.read_offload_store()
    assert read == first
    assert read is not None
    assert read.version > 0
    second = OffloadStoreSettings("s3://bucket/p?endpoint=http://h:9000", 0.0, 6)
    await store.set_offload_store(second)  # the last writer wins
    assert await store.read_offload_store() == second

    # What a newer version wrote in the record survives this one setting it.
    document = json.loads(second.to_json())
    document["store_id"] = "a-uuid"
    now = await store.read_offload_store()
    assert now is not None
    await store.kv.compare_and_set(
        store.keys.offload_store, json.dumps(document).encode(), now.version
    )
    await store.set_offload_store(first)
    kept = await store.read_offload_store()
    assert kept == first
    assert kept is not None
    assert kept.extra == {"store_id": "a-uuid"}


async def test_an_offload_store_of_another_kind_is_refused(store: MetadataStore) -> None:
    for url in ("memory://store", "http://h/b", "s3:/b"):
        with pytest.raises(ValueError, match="expected a file:// or s3:// URL"):
            await store.set_offload_store(OffloadStoreSettings(url))
    assert await store.read_offload_store() is None


async def test_concurrent_settings_end_with_one_of_them(store: MetadataStore) -> None:
    settings = [OffloadStoreSettings(f"file:///srv/o{i}", float(i), i) for i in range(8)]
    await asyncio.gather(*(store.set_offload_store(s) for s in settings))
    assert await store.read_offload_store() in settings


async def test_the_work_list(store: MetadataStore) -> None:
    assert [i async for i in store.list_offloading()] == []
    ledger_id, _closed = await closed_ledger(store)  # a ledger is not on the list by itself
    assert [i async for i in store.list_offloading()] == []
    ids = [ledger_id, 7, 3, 10**15, 42, 9, 10, 11, 12]
    for one in ids:
        await store.add_offloading(one)
    await store.add_offloading(42)  # twice: still once
    await store.remove_offloading(9)
    await store.remove_offloading(9)  # not there: nothing changes
    await store.remove_offloading(123456)
    expected = sorted(set(ids) - {9})
    assert [i async for i in store.list_offloading()] == expected
    assert [i async for i in store.list_offloading(page_size=2)] == expected
    assert [i async for i in store.list_ledgers()] == [ledger_id]  # the list is not ledgers


async def test_the_work_list_is_walked_by_keys_a_bounded_page_at_a_time(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(25):
        await store.add_offloading(await store.allocate_ledger_id())
    calls: list[dict[str, Any]] = []
    real_range = store.kv.range

    async def spy(
        prefix: bytes, after: bytes | None = None, limit: int = 1000, **options: Any
    ) -> tuple[list[KeyValue], int]:
        calls.append({"prefix": prefix, "limit": limit, **options})
        page, revision = await real_range(prefix, after, limit, **options)
        assert all(item.value == b"" for item in page)
        return page, revision

    monkeypatch.setattr(store.kv, "range", spy)
    listed = [i async for i in store.list_offloading(page_size=4)]
    assert listed == sorted(listed)
    assert len(listed) == 25
    assert calls
    assert all(call["keys_only"] for call in calls)
    assert all(call["limit"] == 4 for call in calls)
    assert {call["prefix"] for call in calls} == {store.keys.offloading_prefix}


async def test_a_log_policy(store: MetadataStore) -> None:
    with pytest.raises(NoSuchLogError):
        await store.set_offload_policy("missing", OffloadPolicy(older_than=60))
    created = await store.create_log("orders")
    await store.write_log(created.taken((5, 6), 6))
    policy = OffloadPolicy(older_than=3600, beyond_bytes=1 << 30)
    written = await store.set_offload_policy("orders", policy)
    assert written.offload_policy == policy
    assert (written.ledgers, written.writer) == ((5, 6), 6)
    assert await store.read_log("orders") == written
    again = await store.set_offload_policy("orders", OffloadPolicy(3600.0, 1 << 30))
    assert again.version == written.version  # the same policy: nothing written

    # A roll and a truncation keep it.
    rolled = await store.write_log(written.with_ledgers((5, 6, 8)))
    truncated = await store.write_log(rolled.with_ledgers((8,)))
    assert (await store.read_log("orders")).offload_policy == policy
    assert truncated.offload_policy == policy

    cleared = await store.set_offload_policy("orders", None)
    assert cleared.offload_policy is None
    found, _revision = await store.kv.get(store.keys.log("orders"))
    assert found is not None
    assert "offload_policy" not in json.loads(found.value)


async def test_a_policy_set_while_the_log_rolls_keeps_both(store: MetadataStore) -> None:
    await store.create_log("busy")
    policy = OffloadPolicy(beyond_bytes=100)

    async def roll(ledger_id: int) -> None:
        while True:
            record = await store.read_log("busy")
            try:
                await store.write_log(record.with_ledgers((*record.ledgers, ledger_id)))
            except MetadataVersionError:
                await asyncio.sleep(0)
            else:
                return

    await asyncio.gather(store.set_offload_policy("busy", policy), *(roll(i) for i in range(1, 6)))
    final = await store.read_log("busy")
    assert final.offload_policy == policy
    assert sorted(final.ledgers) == [1, 2, 3, 4, 5]


async def test_offload_transitions_are_compare_and_set(store: MetadataStore) -> None:
    ledger_id, closed = await closed_ledger(store)
    await store.add_offloading(ledger_id)

    def start(uid: str) -> Any:
        def change(metadata: LedgerMetadata) -> LedgerMetadata | None:
            if metadata.offload is not None or not metadata.is_closed:
                return None
            return metadata.with_offload(copying(uid, ledger_id))

        return change

    # Two attempts race to take the ledger: exactly one record lands.
    results = await asyncio.gather(
        *(store.update_ledger(ledger_id, start(f"u{i}")) for i in range(6))
    )
    uids = {r.offload.uid for r in results if r.offload is not None}
    assert len(uids) == 1
    taken = await store.read_ledger(ledger_id)
    assert taken.offload is not None
    assert taken.offload.uid in uids

    # A write at the version read before loses, whatever it carries.
    with pytest.raises(MetadataVersionError):
        await store.write_ledger(ledger_id, closed.with_offload(copying("stale", ledger_id)))

    def finish(uid: str) -> Any:
        def change(metadata: LedgerMetadata) -> LedgerMetadata | None:
            record = metadata.offload
            if record is None or record.uid != uid or record.state is not OffloadState.COPYING:
                return None
            done = dataclasses.replace(record, state=OffloadState.COPIED, copied=2_000, size=9)
            return metadata.with_offload(done)

        return change

    assert (await store.update_ledger(ledger_id, finish("not-this-attempt"))) == taken
    copied = await store.update_ledger(ledger_id, finish(taken.offload.uid))
    assert copied.offload is not None
    assert copied.offload.state is OffloadState.COPIED
    assert copied.version > taken.version
    assert await store.read_ledger(ledger_id) == copied
    assert [i async for i in store.list_offloading()] == [ledger_id]


async def test_other_updates_of_a_ledger_keep_its_offload_record(store: MetadataStore) -> None:
    ledger_id = await store.allocate_ledger_id()
    record = copying("u1", ledger_id)
    await store.create_ledger(
        ledger_id, LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),)).with_offload(record)
    )
    replacement = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3184")
    for change in (
        LedgerMetadata.in_recovery,
        lambda m: m.closed(9, 1000),
        lambda m: m.with_fragment(5, replacement),  # an ensemble change (a repair of a fragment)
        lambda m: m.replace(custom_metadata={"app": b"x"}),
    ):
        updated = await store.update_ledger(ledger_id, change)
        assert updated.offload == record
        assert (await store.read_ledger(ledger_id)).offload == record
    final = await store.read_ledger(ledger_id)
    assert (final.is_closed, final.fragments[-1].ensemble) == (True, replacement)


async def test_offload_keys_are_apart_from_the_others(store: MetadataStore) -> None:
    ledger_id, _closed = await closed_ledger(store)
    await store.add_offloading(ledger_id)
    await store.set_offload_store(OffloadStoreSettings("file:///srv/offload"))
    await store.create_log("orders")
    assert [i async for i in store.list_ledgers()] == [ledger_id]
    assert [n async for n in store.list_logs()] == ["orders"]
    assert [i async for i, _m in store.scan_ledgers()] == [ledger_id]
    assert isinstance(await store.read_log("orders"), LogMetadata)
