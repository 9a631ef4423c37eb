"""What listing the under-replication marks costs the store: the auditor's passes and every
worker's search for work (``AutoRecoveryStore.marks`` from 0 or from a cursor, ``marked_ids``).

The marks are keys named by ledger id, as the ledgers are, and etcd counts a limited range to
its end on every page just the same: paged by limit alone, a pass over N marks at P a page
counted about N^2/(2P) keys (333,000 marks at 500 a page: 1.1e8). They now walk the ledgers'
id windows (``metadata.listing``). ``CountingKV`` (from ``test_listing_cost``) records every
range call and works out what it counted from the keys in the store; on a real etcd, etcd's own
count of every call is recorded too, and must agree. Whatever the walk, the listings must give
what one range over the whole prefix gives: the same marks, versions included, in id order.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from aiobk.metadata import (
    LOST_BOOKIE,
    EtcdProcess,
    KeyLayout,
    MemoryKV,
    MetadataStore,
    UnderReplication,
)
from aiobk.metadata.kv_etcd import EtcdKV
from aiobk.metadata.uri import open_store
from tests.metadata.test_listing_cost import (
    CONCURRENCY,
    LEDGERS,
    CountingKV,
    RangeCall,
    _create_ledgers,
    own_etcd,  # noqa: F401 -- the fixture: an etcd of this module's own, revisions from ~0
)
from tests.support.names import unique_name

MARKED = 4_000  # of the LEDGERS ledgers, picked at random: the gaps between marked ids vary
PAGES = (500, 100)  # marks()' default page, and a small one that makes more pages
LOST = "127.0.0.1:3182"


async def _mark(store: MetadataStore, ids: list[int]) -> None:
    """Mark ``ids`` as the auditor does when a bookie is lost (a read, then a create)."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(ledger_id: int) -> None:
        async with gate:
            await store.autorecovery.mark(ledger_id, [LOST], LOST_BOOKIE, 1_000)

    await asyncio.gather(*(one(i) for i in ids))


async def _marks_of_some_ledgers(store: MetadataStore, seed: int) -> list[int]:
    """LEDGERS ledgers made as a client makes them, then MARKED of them marked: their ids."""
    ids = await _create_ledgers(store, LEDGERS)
    marked = sorted(random.Random(seed).sample(ids, MARKED))
    await _mark(store, marked)
    return marked


async def _every_mark(store: MetadataStore, kv: CountingKV) -> list[UnderReplication]:
    """The marks as one range over the whole prefix gives them (what the listings must give),
    read past the counting wrapper."""
    page, _rev = await kv.inner.range(store.keys.underreplicated_prefix, None, 1_000_000)
    return [UnderReplication.from_json(item.value, item.mod_revision) for item in page]


def _mark_calls(kv: CountingKV, keys: KeyLayout) -> list[RangeCall]:
    return [call for call in kv.calls if call.prefix == keys.underreplicated_prefix]


def _check_cost(
    kv: CountingKV, keys: KeyLayout, marked: list[int], listed: int, page_size: int
) -> list[int]:
    """The per-call bounds of a listing that returned ``listed`` of the ``marked`` ledgers'
    marks; returns what each call counted."""
    stored = sorted(keys.underreplicated(i) for i in marked)
    calls = _mark_calls(kv, keys)
    counted = [call.counted(stored) for call in calls]
    for call, walked in zip(calls, counted, strict=True):
        assert 0 < call.limit <= page_size, call
        assert call.returned <= call.limit, call
        # The heart of it: no call counts more than a couple of pages of marks (paged by
        # limit alone, the first call of a pass counted all of them).
        assert walked <= 2 * page_size, (call, walked)
    assert sum(counted) <= 2 * listed + page_size, sum(counted)
    assert len(calls) <= 4 * listed // page_size + 40, len(calls)  # pages, not marks
    return counted


async def _list_and_check(
    store: MetadataStore, kv: CountingKV, marked: list[int], page_size: int
) -> list[tuple[str, list[int]]]:
    """marks() from 0 and from a cursor halfway, marked_ids(): each gives what one range over
    the prefix gives, within the bounds. Returns (what, counted per call) for each."""
    expected = await _every_mark(store, kv)
    assert [m.ledger_id for m in expected] == marked
    cursor = marked[len(marked) // 2]
    suffix = [m for m in expected if m.ledger_id > cursor]
    recovery = store.autorecovery
    out: list[tuple[str, list[int]]] = []

    kv.calls.clear()
    listed = [m async for m in recovery.marks(page_size=page_size)]
    assert listed == expected
    assert [m.version for m in listed] == [m.version for m in expected]
    out.append(("marks()", _check_cost(kv, store.keys, marked, len(listed), page_size)))

    kv.calls.clear()
    listed = [m async for m in recovery.marks(page_size=page_size, after_ledger=cursor)]
    assert listed == suffix
    assert [m.version for m in listed] == [m.version for m in suffix]
    out.append(("marks(after_ledger)", _check_cost(kv, store.keys, marked, len(listed), page_size)))

    kv.calls.clear()
    assert [i async for i in recovery.marked_ids(page_size=page_size)] == marked
    out.append(("marked_ids()", _check_cost(kv, store.keys, marked, len(marked), page_size)))
    return out


def _report(where: str, page_size: int, results: list[tuple[str, list[int]]]) -> str:
    return "".join(
        f"\n{where}, {MARKED:,} marks of {LEDGERS:,} ledgers, page {page_size}, {what}: "
        f"{len(counted)} range calls, at most {max(counted)} keys counted by one, "
        f"{sum(counted):,} in all"
        for what, counted in results
    )


@pytest.mark.timeout(60)
async def test_listing_4000_marks_in_memory_counts_a_window_per_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = unique_name("marks-listing")
    kv = CountingKV(MemoryKV(name))
    store = MetadataStore(kv, "marks-listing")
    try:
        marked = await _marks_of_some_ledgers(store, seed=16)
        for page_size in PAGES:
            results = await _list_and_check(store, kv, marked, page_size)
            with capsys.disabled():
                print(_report("memory", page_size, results))
    finally:
        await store.close()
        MemoryKV.forget(name)


@pytest.mark.timeout(90)
async def test_listing_4000_marks_on_etcd_counts_a_window_per_call(
    own_etcd: EtcdProcess,  # noqa: F811 -- the fixture imported above
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same on a real etcd, with etcd's own count of every range call over the marks (its
    answer's ``count``) recorded at the gRPC stub: it must agree with the wrapper's reckoning,
    and no request asks for a sort order (a sorted range etcd reads whole, whatever the
    limit)."""
    opened = open_store(own_etcd.uri(unique_name("marks-listing")))
    etcd_kv = opened.kv
    assert isinstance(etcd_kv, EtcdKV)
    kv = CountingKV(etcd_kv)
    store = MetadataStore(kv, opened.keys.root.decode())
    seen: list[tuple[Any, Any]] = []  # (RangeRequest, RangeResponse) of every range
    try:
        marked = await _marks_of_some_ledgers(store, seed=18)
        client = await etcd_kv._clients.get()
        original = client.kvstub.Range

        async def recording(request: Any, **kwargs: Any) -> Any:
            response = await original(request, **kwargs)
            seen.append((request, response))
            return response

        client.kvstub.Range = recording
        prefix = store.keys.underreplicated_prefix
        for page_size in PAGES:
            seen.clear()
            results = await _list_and_check(store, kv, marked, page_size)
            ranges = [
                (request, response)
                for request, response in seen
                if request.range_end and bytes(request.key).startswith(prefix)
            ]
            # The first is the reference range over the whole prefix; then the listings' calls.
            reckoned = [walked for _what, counted in results for walked in counted]
            assert [int(response.count) for _request, response in ranges[1:]] == reckoned
            assert all(request.sort_order == 0 for request, _response in ranges)  # NONE
            with capsys.disabled():
                print(_report("etcd", page_size, results))
    finally:
        await store.close()


@pytest.mark.timeout(60)
async def test_a_dense_run_of_marks_after_a_long_sparse_stretch_is_not_counted_page_after_page(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A few old ledgers marked, then 50,000 revisions of other writes, then 5,000 new ledgers,
    every one marked (a bookie holding all the recent ledgers was lost): the walk widens its
    windows over the sparse stretch and meets the dense run with a wide window. That one call
    may count the run, but the walk then narrows at once: the run is not counted again for
    every page of it. The same from a worker's cursor on the last old mark."""
    name = unique_name("marks-gap")
    memory = MemoryKV(name)
    kv = CountingKV(memory)
    store = MetadataStore(kv, "marks-listing")
    page_size = 100
    try:
        old = await _create_ledgers(store, 20)
        await _mark(store, old)
        for _ in range(50_000):
            await memory.bump(b"/elsewhere")
        new = await _create_ledgers(store, LEDGERS)
        await _mark(store, new)
        marked = old + new
        expected = await _every_mark(store, kv)
        stored = sorted(store.keys.underreplicated(i) for i in marked)
        for what, after in (("marks()", None), ("marks(after_ledger)", old[-1])):
            kv.calls.clear()
            listed = [m async for m in store.autorecovery.marks(page_size, after)]
            assert listed == [m for m in expected if after is None or m.ledger_id > after]
            calls = _mark_calls(kv, store.keys)
            counted = [call.counted(stored) for call in calls]
            assert all(call.returned <= call.limit <= page_size for call in calls)
            assert sum(counted) <= 3 * len(listed), sum(counted)
            assert max(counted) <= len(listed)
            with capsys.disabled():
                print(
                    f"\nsparse then dense, {len(listed):,} marks, page {page_size}, {what}: "
                    f"{len(calls)} range calls, at most {max(counted):,} keys counted by one, "
                    f"{sum(counted):,} in all"
                )
    finally:
        await store.close()
        MemoryKV.forget(name)
