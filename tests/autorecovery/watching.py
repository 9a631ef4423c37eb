"""Waiting for what autorecovery does by watching the store (etcd watches), not by polling it:
the marks, the registry, one ledger's metadata, one key."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from aiobk.metadata import BookieServiceInfo, LedgerMetadata, MetadataStore, UnderReplication
from aiobk.metadata.kv import Watch

Marks = dict[int, UnderReplication]


class MarkWatch:
    """The marks as they are now, kept up to date from a watch opened at the revision read."""

    def __init__(self, store: MetadataStore, marks: Marks, watch: Watch) -> None:
        self._store = store
        self.marks = marks
        self._watch = watch

    async def until(self, wanted: Callable[[Marks], bool], timeout: float) -> Marks:
        """The marks once ``wanted`` holds of them (TimeoutError after ``timeout``)."""
        keys = self._store.keys
        async with asyncio.timeout(timeout):
            while not wanted(self.marks):
                event = await self._watch.next(timeout)
                ledger_id = keys.ledger_id_of(keys.underreplicated_prefix, event.key)
                if event.value is None:
                    self.marks.pop(ledger_id, None)
                else:
                    self.marks[ledger_id] = UnderReplication.from_json(event.value, event.revision)
        return self.marks


@contextlib.asynccontextmanager
async def watching_marks(store: MetadataStore) -> AsyncIterator[MarkWatch]:
    prefix = store.keys.underreplicated_prefix
    page, revision = await store.kv.range(prefix, None, 100_000)
    marks = {
        store.keys.ledger_id_of(prefix, item.key): UnderReplication.from_json(
            item.value, item.mod_revision
        )
        for item in page
    }
    watch = await store.kv.watch(prefix, prefix=True, start_revision=revision + 1)
    try:
        yield MarkWatch(store, marks, watch)
    finally:
        await watch.close()


async def registry_until(
    store: MetadataStore, wanted: Callable[[list[BookieServiceInfo]], bool], timeout: float
) -> list[BookieServiceInfo]:
    """The registered bookies once ``wanted`` holds of them."""
    async with asyncio.timeout(timeout):
        async with contextlib.aclosing(store.watch_bookies()) as changes:
            async for bookies in changes:
                if wanted(bookies):
                    return bookies
    raise AssertionError("the registry watch ended")  # pragma: no cover


async def unregistered(store: MetadataStore, bookie_id: str, timeout: float = 10.0) -> None:
    await registry_until(store, lambda bs: bookie_id not in {b.bookie_id for b in bs}, timeout)


async def ledger_until(
    store: MetadataStore,
    ledger_id: int,
    wanted: Callable[[LedgerMetadata | None], bool],
    timeout: float,
) -> LedgerMetadata | None:
    """The ledger's metadata once ``wanted`` holds of it (None: deleted)."""
    async with asyncio.timeout(timeout):
        async with contextlib.aclosing(store.watch_ledger(ledger_id)) as changes:
            async for metadata in changes:
                if wanted(metadata):
                    return metadata
    raise AssertionError("the ledger watch ended")  # pragma: no cover


async def key_until(
    store: MetadataStore, key: bytes, wanted: Callable[[bytes | None], bool], timeout: float
) -> bytes | None:
    """The value of ``key`` once ``wanted`` holds of it (None: absent)."""
    async with asyncio.timeout(timeout):
        found, revision = await store.kv.get(key)
        value = None if found is None else found.value
        if wanted(value):
            return value
        async with await store.kv.watch(key, prefix=False, start_revision=revision + 1) as watch:
            async for event in watch:
                if wanted(event.value):
                    return event.value
    raise AssertionError("the key watch ended")  # pragma: no cover
