"""A release's client on metadata that carries offloading's fields: ledgers with an ``"offload"``
record, a log with an ``"offload_policy"``, and the offload store and work list keys beside
them. The release reads them, and its own updates -- recovery closing a ledger, a writer taking
and rolling the log, a truncation -- write the fields back as they were. The bookies are this
tree's (the wire is tests/compat/test_wire.py's concern)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aiobk import BookKeeper
from aiobk.bookie import Bookie
from aiobk.metadata import (
    LedgerState,
    MetadataStore,
    OffloadPolicy,
    OffloadRecord,
    OffloadState,
    OffloadStoreSettings,
)
from tests.compat.driver import run_steps
from tests.compat.harness import Release

STORE_URL = "s3://offload/cluster?endpoint=http://127.0.0.1:9000"


def payloads(tag: str, count: int) -> list[str]:
    return [f"{tag}-{i}" for i in range(count)]


def offload(ledger_id: int, state: OffloadState) -> OffloadRecord:
    copied = state is not OffloadState.COPYING
    return OffloadRecord(
        f"uid-{ledger_id}", STORE_URL, f"ledgers/{ledger_id:019d}/uid-{ledger_id}.aobk", state,
        1_700_000_000_000, copied=1_700_000_060_000 if copied else None,
        size=4096 if copied else 0, index_offset=3900 if copied else 0,
        index_length=160 if copied else 0, index_crc=0xDEADBEEF if copied else 0,
        entries=20 if copied else 0, block_size=1 << 22,
    )  # fmt: skip


async def stored(store: MetadataStore, key: bytes) -> dict[str, Any]:
    """The JSON of ``key`` as the store holds it."""
    found, _revision = await store.kv.get(key)
    assert found is not None, key
    document: dict[str, Any] = json.loads(found.value)
    return document


async def mark(store: MetadataStore, ledger_id: int, record: OffloadRecord) -> None:
    """Put ``record`` on the ledger as the offloader does: the work list first, then the
    compare-and-set of the ledger's metadata."""
    await store.add_offloading(ledger_id)
    updated = await store.update_ledger(ledger_id, lambda m: m.with_offload(record))
    assert updated.offload == record


@pytest.fixture
async def cluster(head_bookies: Callable[..., Awaitable[list[Bookie]]]) -> list[Bookie]:
    return await head_bookies(3)


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("cluster")
async def test_release_reads_and_closes_ledgers_carrying_an_offload_record(
    release: Release, uri: str, client: BookKeeper
) -> None:
    written = await release.run(uri, [
        {"op": "create", "as": "closed", "ensemble": [3, 3, 2], "password": "pw"},
        {"op": "append", "ledger": "closed", "payloads": payloads("c", 20)},
        {"op": "close", "ledger": "closed"},
        {"op": "create", "as": "open", "ensemble": [3, 3, 2], "password": "pw"},
        {"op": "append", "ledger": "open", "payloads": payloads("o", 10)},
        {"op": "await_lac", "ledger": "open", "password": "pw"},
        {"op": "exit"},
    ])  # fmt: skip
    closed, open_ = written[0]["ledger_id"], written[3]["ledger_id"]
    store = client.store
    await store.set_offload_store(OffloadStoreSettings(STORE_URL, 600.0, 1_700_000_000_000))
    copied = offload(closed, OffloadState.COPIED)
    await mark(store, closed, copied)
    # Never on an open ledger in a cluster's life; here, to have the release's recovery write
    # the field back twice (IN_RECOVERY, then CLOSED).
    copying = offload(open_, OffloadState.COPYING)
    await mark(store, open_, copying)
    fields = {i: (await stored(store, store.keys.ledger(i)))["offload"] for i in (closed, open_)}

    read = await release.run(uri, [
        {"op": "open", "as": "c", "ledger_id": closed, "password": "pw", "recovery": False},
        {"op": "read", "handle": "c"},
        {"op": "open", "as": "o", "ledger_id": open_, "password": "pw"},  # recovery closes it
        {"op": "read", "handle": "o"},
    ])  # fmt: skip
    assert read[0] == {"ledger_id": closed, "closed": True, "lac": 19}
    assert read[1]["data"] == payloads("c", 20)
    assert read[2] == {"ledger_id": open_, "closed": True, "lac": 9}
    assert read[3]["data"] == payloads("o", 10)

    recovered = await store.read_ledger(open_)
    assert (recovered.state, recovered.last_entry_id) == (LedgerState.CLOSED, 9)
    assert recovered.offload == copying
    assert (await store.read_ledger(closed)).offload == copied
    for ledger_id, field in fields.items():
        assert (await stored(store, store.keys.ledger(ledger_id)))["offload"] == field
    assert [i async for i in store.list_offloading()] == sorted((closed, open_))
    assert await store.read_offload_store() == OffloadStoreSettings(
        STORE_URL, 600.0, 1_700_000_000_000
    )


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("cluster")
async def test_release_rolls_and_truncates_a_log_carrying_an_offload_policy(
    release: Release, uri: str, client: BookKeeper
) -> None:
    store = client.store
    first = await run_steps(client, [
        {"op": "log_write", "log": "orders", "records": [{"data": d} for d in payloads("a", 3)],
         "options": {"roll_bytes": 1}},
    ])  # fmt: skip
    assert len({ledger for ledger, _entry in first[0]["positions"]}) == 3
    head_ledgers = list((await store.read_log("orders")).ledgers)  # with the one the roll left
    policy = OffloadPolicy(older_than=3600.0, beyond_bytes=1 << 20)
    await store.set_offload_policy("orders", policy)
    copied = offload(head_ledgers[0], OffloadState.COPIED)
    await mark(store, head_ledgers[0], copied)  # closed by the roll
    field = (await stored(store, store.keys.log("orders")))["offload_policy"]

    # The release reads through the offloaded ledger, takes the log, rolls it several times.
    more = [{"data": d} for d in payloads("b", 6)]
    read, wrote = await release.run(uri, [
        {"op": "log_read", "log": "orders"},
        {"op": "log_write", "log": "orders", "records": more, "options": {"roll_bytes": 12}},
    ])  # fmt: skip
    assert [r["data"] for r in read["records"]] == payloads("a", 3)
    release_ledgers = sorted({ledger for ledger, _entry in wrote["positions"]})
    assert len(release_ledgers) > 1
    record = await store.read_log("orders")
    assert record.offload_policy == policy
    assert (await stored(store, store.keys.log("orders")))["offload_policy"] == field
    assert (await store.read_ledger(head_ledgers[0])).offload == copied

    # Its truncation drops the offloaded ledger and keeps the policy.
    (truncated,) = await release.run(
        uri, [{"op": "log_truncate", "log": "orders", "before": [release_ledgers[0], 0]}]
    )
    assert truncated["deleted"] == head_ledgers
    record = await store.read_log("orders")
    assert record.offload_policy == policy
    assert record.ledgers[0] == release_ledgers[0]
    assert (await stored(store, store.keys.log("orders")))["offload_policy"] == field

    after = await run_steps(client, [{"op": "log_read", "log": "orders"}])
    assert [r["data"] for r in after[0]["records"]] == payloads("b", 6)
    # What the release cannot know is left for this tree: the work list still names the
    # deleted ledger, for the sweep to find its object.
    assert [i async for i in store.list_offloading()] == [head_ledgers[0]]
