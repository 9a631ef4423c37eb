"""What listing the ledgers costs the store: the metadata side of GC pages through etcd, with no
single range read of a million keys.

etcd counts every key of a range to its end even when a limit cuts the answer short, and a
sorted range it reads whole (values and all) before cutting it. So the cost of one range call
is the number of keys between its start and its end, not the keys it returns. A KV wrapper
records every range call ``list_ledgers`` makes and works out what each one counted from the
keys in the store; on a real etcd, etcd's own count for each call (the answer's ``count``) is
recorded too, and must agree.

A listing that went back to one range over the whole prefix -- a page by limit alone, or a
probe for the lowest id with ``limit=1`` -- counts every ledger in one call, and fails here.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from aiobk.metadata import (
    KV,
    EtcdProcess,
    Fragment,
    KeyValue,
    LedgerMetadata,
    MemoryKV,
    MetadataStore,
    Watch,
)
from aiobk.metadata.kv import prefix_end
from aiobk.metadata.kv_etcd import EtcdKV
from aiobk.metadata.uri import open_store
from tests.support.names import unique_name

LEDGERS = 5_000
ENSEMBLE = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
METADATA = LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),))
CONCURRENCY = 64


@dataclass(frozen=True)
class RangeCall:
    prefix: bytes
    after: bytes | None
    limit: int
    end: bytes | None
    returned: int

    def counted(self, keys: list[bytes]) -> int:
        """How many of ``keys`` (sorted) lie between this call's start and its end: what the
        store walked to answer it."""
        start = self.after + b"\x00" if self.after is not None else self.prefix
        stop = self.end if self.end is not None else prefix_end(self.prefix)
        return max(0, bisect.bisect_left(keys, stop) - bisect.bisect_left(keys, start))


class CountingKV(KV):
    """A KV that records every ``range`` call and passes everything through."""

    def __init__(self, inner: KV) -> None:
        self.inner = inner
        self.description = inner.description
        self.calls: list[RangeCall] = []

    async def range(
        self,
        prefix: bytes,
        after: bytes | None = None,
        limit: int = 1000,
        *,
        keys_only: bool = False,
        end: bytes | None = None,
    ) -> tuple[list[KeyValue], int]:
        page, revision = await self.inner.range(prefix, after, limit, keys_only=keys_only, end=end)
        self.calls.append(RangeCall(prefix, after, limit, end, len(page)))
        return page, revision

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        return await self.inner.get(key)

    async def create(self, key: bytes, value: bytes, lease: int = 0) -> int:
        return await self.inner.create(key, value, lease)

    async def compare_and_set(self, key: bytes, value: bytes, expected: int, lease: int = 0) -> int:
        return await self.inner.compare_and_set(key, value, expected, lease)

    async def delete(self, key: bytes, expected: int | None = None) -> None:
        await self.inner.delete(key, expected)

    async def bump(self, key: bytes) -> int:
        return await self.inner.bump(key)

    async def watch(self, key: bytes, *, prefix: bool, start_revision: int) -> Watch:
        return await self.inner.watch(key, prefix=prefix, start_revision=start_revision)

    async def compact(self, revision: int) -> None:
        await self.inner.compact(revision)

    async def grant_lease(self, ttl: float) -> tuple[int, float]:
        return await self.inner.grant_lease(ttl)

    async def keep_alive(self, lease: int) -> float:
        return await self.inner.keep_alive(lease)

    async def revoke_lease(self, lease: int) -> None:
        await self.inner.revoke_lease(lease)

    async def close(self) -> None:
        await self.inner.close()


async def _create_ledgers(store: MetadataStore, count: int) -> list[int]:
    """``count`` ledgers as a client makes them: an id allocated, then the metadata stored."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> int:
        async with gate:
            ledger_id = await store.allocate_ledger_id()
            await store.create_ledger(ledger_id, METADATA)
            return ledger_id

    return sorted(await asyncio.gather(*(one() for _ in range(count))))


def _ledger_calls(kv: CountingKV, store: MetadataStore) -> list[RangeCall]:
    return [call for call in kv.calls if call.prefix == store.keys.ledgers]


def _check_listing_cost(
    kv: CountingKV, store: MetadataStore, ids: list[int], page_size: int
) -> list[int]:
    """The per-call bounds; returns what each call counted."""
    keys = sorted(store.keys.ledger(i) for i in ids)
    calls = _ledger_calls(kv, store)
    counted = [call.counted(keys) for call in calls]
    for call, walked in zip(calls, counted, strict=True):
        assert 0 < call.limit <= page_size, call
        assert call.returned <= call.limit, call
        # The heart of it: no call walks more than a couple of pages of keys (one range over
        # the whole prefix walks all 5,000).
        assert walked <= 2 * page_size, (call, walked)
    assert sum(counted) <= 2 * len(ids) + page_size, sum(counted)
    assert len(calls) <= 4 * len(ids) // page_size + 40, len(calls)  # pages, not keys
    return counted


@pytest.fixture(scope="module")
def own_etcd() -> Iterator[EtcdProcess]:
    """An etcd of this module's own: ids (revisions) start near 0, as in a new cluster."""
    server = EtcdProcess().start()
    yield server
    server.stop()


@pytest.mark.timeout(60)
async def test_listing_5000_ledgers_in_memory_counts_a_window_per_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = unique_name("listing")
    kv = CountingKV(MemoryKV(name))
    store = MetadataStore(kv, "listing")
    try:
        ids = await _create_ledgers(store, LEDGERS)
        for page_size in (1000, 100):
            kv.calls.clear()
            assert [i async for i in store.list_ledgers(page_size=page_size)] == ids
            counted = _check_listing_cost(kv, store, ids, page_size)
            with capsys.disabled():
                print(
                    f"\nmemory, {LEDGERS:,} ledgers, page {page_size}: {len(counted)} range "
                    f"calls, at most {max(counted)} keys counted by one, {sum(counted):,} in all"
                )
    finally:
        await store.close()
        MemoryKV.forget(name)


@pytest.mark.timeout(90)
async def test_listing_5000_ledgers_on_etcd_counts_a_window_per_call(
    own_etcd: EtcdProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same on a real etcd, with etcd's own count of every range call (its answer's
    ``count``) recorded at the gRPC stub: it must agree with the wrapper's reckoning, and no
    request asks for a sort order (a sorted range etcd reads whole, whatever the limit)."""
    opened = open_store(own_etcd.uri(unique_name("listing")))
    etcd_kv = opened.kv
    assert isinstance(etcd_kv, EtcdKV)
    kv = CountingKV(etcd_kv)
    store = MetadataStore(kv, opened.keys.root.decode())
    seen: list[tuple[Any, Any]] = []  # (RangeRequest, RangeResponse) of every range
    try:
        ids = await _create_ledgers(store, LEDGERS)
        client = await etcd_kv._clients.get()
        original = client.kvstub.Range

        async def recording(request: Any, **kwargs: Any) -> Any:
            response = await original(request, **kwargs)
            seen.append((request, response))
            return response

        client.kvstub.Range = recording
        for page_size in (1000, 100):
            kv.calls.clear()
            seen.clear()
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert [i async for i in store.list_ledgers(page_size=page_size)] == ids
            took = loop.time() - started
            counted = _check_listing_cost(kv, store, ids, page_size)
            ranges = [
                (request, response)
                for request, response in seen
                if request.range_end and bytes(request.key).startswith(store.keys.ledgers)
            ]
            assert [int(response.count) for _request, response in ranges] == counted
            assert all(request.sort_order == 0 for request, _response in ranges)  # NONE
            with capsys.disabled():
                print(
                    f"\netcd, {LEDGERS:,} ledgers, page {page_size}: {len(counted)} range "
                    f"calls, at most {max(counted)} keys counted by one (etcd's count), "
                    f"{sum(counted):,} in all; listed in {took * 1000:.0f} ms"
                )
    finally:
        await store.close()


@pytest.mark.timeout(60)
async def test_a_dense_run_after_a_long_sparse_stretch_is_not_counted_page_after_page(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A few old ledgers, then 50,000 revisions of other writes (ledgers made and deleted long
    ago), then 5,000 new ones: the walk widens its windows over the sparse stretch and then
    meets the dense run with a wide window. That one call may count the run (etcd cannot find
    a range's first key without counting the range), but the walk then narrows at once: the
    run is not counted again for every page of it (which cost ~30x the ledgers here)."""
    name = unique_name("listing-gap")
    memory = MemoryKV(name)
    kv = CountingKV(memory)
    store = MetadataStore(kv, "listing")
    page_size = 100
    try:
        old = await _create_ledgers(store, 20)
        for _ in range(50_000):
            await memory.bump(b"/elsewhere")
        ids = old + await _create_ledgers(store, LEDGERS)
        kv.calls.clear()
        assert [i async for i in store.list_ledgers(page_size=page_size)] == ids
        keys = sorted(store.keys.ledger(i) for i in ids)
        calls = _ledger_calls(kv, store)
        counted = [call.counted(keys) for call in calls]
        assert all(call.returned <= call.limit <= page_size for call in calls)
        assert sum(counted) <= 3 * len(ids), sum(counted)
        assert max(counted) <= len(ids)
        with capsys.disabled():
            print(
                f"\nsparse then dense, {len(ids):,} ledgers, page {page_size}: {len(calls)} "
                f"range calls, at most {max(counted):,} keys counted by one, "
                f"{sum(counted):,} in all"
            )
    finally:
        await store.close()
        MemoryKV.forget(name)
