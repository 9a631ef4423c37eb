"""Reading offloaded ledgers from their objects (docs/design/tiered-storage.md, "Reading").

A ledger whose bookies released it is read from its object alone, with no bookie asked:
``StoreEntryReader`` reads the object's index for a range with one ranged read, then the
entries' bytes in a few coalesced ones, and checks each entry twice -- the object's CRC of it,
then its own digest, exactly as a copy from a bookie is checked -- so a reader sees the same
``Entry``s and the same errors whichever holds the ledger.

A handle opened while the bookies still held the ledger reads through ``TieredEntryReader``:
the bookies first, and when none of them holds an entry any more it reads the ledger's
metadata again and, the ledger being offloaded, goes on from the object.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from aiobk.client.config import ClientConfig
from aiobk.client.context import ClientContext
from aiobk.client.digest import Digester
from aiobk.client.entry import Entry
from aiobk.client.offload.refs import is_released, offload_ref
from aiobk.client.pool import BookiePool
from aiobk.client.read import EntryReader, EntrySource
from aiobk.client.stats import ClientStats
from aiobk.metadata import LedgerMetadata, MetadataStore
from aiobk.protocol import EntryBody, MalformedEntryError, parse_entry
from aiobk.protocol.errors import DigestMismatchError, MalformedObjectError, NoSuchEntryError
from aiobk.tiered.objects import ObjectReader, OffloadRef
from aiobk.tiered.open import StoreCache


class StoreEntryReader:
    """The entries of one offloaded ledger, from its object; the reader ``ReadHandle`` uses
    for a released ledger."""

    def __init__(
        self,
        ledger_id: int,
        digest: Digester,
        objects: StoreCache,
        ref: OffloadRef,
        config: ClientConfig,
        stats: ClientStats | None = None,
    ) -> None:
        self.ledger_id = ledger_id
        self._digest = digest
        self._ref = ref
        self._objects = ObjectReader(
            objects.get(ref.url), ref, max_read_bytes=max(config.read_ahead_bytes, 1)
        )
        self._stats = stats or ClientStats()

    def _checked(self, entry_id: int, raw: bytes) -> EntryBody:
        try:
            body = parse_entry(raw)
            self._digest.verify(body, self.ledger_id, entry_id)
        except (MalformedEntryError, DigestMismatchError) as exc:
            raise DigestMismatchError(f"object {self._ref.key}: {exc}") from None
        self._stats.entries_read += 1
        return body

    def _check_range(self, first: int, last: int) -> None:
        if first < self._ref.first_entry or last > self._ref.last_entry:
            raise NoSuchEntryError(
                f"ledger {self.ledger_id} holds entries {self._ref.first_entry}.."
                f"{self._ref.last_entry}, not {first}..{last}"
            )

    async def fetch(self, metadata: LedgerMetadata, entry_id: int) -> EntryBody:
        """The entry's verified body."""
        del metadata
        async for body in self.iter_bodies_of(entry_id, entry_id):
            return body
        raise NoSuchEntryError(f"entry {self.ledger_id}/{entry_id} is not in its object")

    async def read_one(self, metadata: LedgerMetadata, entry_id: int) -> Entry:
        body = await self.fetch(metadata, entry_id)
        return Entry(self.ledger_id, entry_id, body.payload)

    async def iter_bodies_of(self, first: int, last: int) -> AsyncGenerator[EntryBody, None]:
        """The verified bodies of entries first..last, in order."""
        self._check_range(first, last)
        try:
            async for entry_id, raw in self._objects.bodies(first, last):
                yield self._checked(entry_id, raw)
        except MalformedObjectError as exc:
            # A damaged object is what a damaged copy on a bookie is: no good copy to serve.
            raise DigestMismatchError(f"ledger {self.ledger_id}: {exc}") from None

    def iter_range(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> AsyncGenerator[Entry, None]:
        """Entries first..last inclusive, in order."""
        del metadata
        return self.entries(first, last)

    async def entries(self, first: int, last: int) -> AsyncGenerator[Entry, None]:
        """Entries first..last inclusive, in order, checked: what a reader holding only the
        object's location (a Spark task) reads."""
        stream = self.iter_bodies_of(first, last)
        async with contextlib.aclosing(stream):
            async for body in stream:
                yield Entry(self.ledger_id, body.entry_id, body.payload)

    def iter_bodies(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> AsyncGenerator[EntryBody, None]:
        del metadata
        return self.iter_bodies_of(first, last)

    async def read_range(self, metadata: LedgerMetadata, first: int, last: int) -> list[Entry]:
        return [entry async for entry in self.iter_range(metadata, first, last)]


class TieredEntryReader(EntryReader):
    """The bookies' reader, which turns to the ledger's object once the bookies have dropped
    the ledger (it was released after this reader's handle opened)."""

    def __init__(
        self,
        ledger_id: int,
        digest: Digester,
        pool: BookiePool,
        config: ClientConfig,
        stats: ClientStats | None,
        store: MetadataStore,
        objects: StoreCache,
    ) -> None:
        super().__init__(ledger_id, digest, pool, config, stats)
        self._metadata_store = store
        self._objects_cache = objects
        self._store_reader: StoreEntryReader | None = None

    async def fetch(self, metadata: LedgerMetadata, entry_id: int) -> EntryBody:
        if self._store_reader is None:
            try:
                return await super().fetch(metadata, entry_id)
            except NoSuchEntryError:
                # Only a closed ledger is ever offloaded: an open one's missing entry is an
                # entry not yet written, and costs no metadata read.
                if not metadata.is_closed or not await self._turn_to_store():
                    raise
        assert self._store_reader is not None
        return await self._store_reader.fetch(metadata, entry_id)

    async def _turn_to_store(self) -> bool:
        """After every bookie said it has no such entry: whether the ledger is now read from
        its object (its metadata, read again, names a complete copy)."""
        metadata = await self._metadata_store.read_ledger(self.ledger_id)
        ref = offload_ref(self.ledger_id, metadata)
        if ref is None:
            return False
        self._store_reader = StoreEntryReader(
            self.ledger_id, self._digest, self._objects_cache, ref, self._config, self._stats
        )
        return True


def entry_source(
    ctx: ClientContext,
    objects: StoreCache,
    ledger_id: int,
    metadata: LedgerMetadata,
    digest: Digester,
) -> EntrySource:
    """Where a read handle's entries come from: the object alone for a ledger the bookies
    released; else the bookies, turning to the object if they release it meanwhile."""
    ref = offload_ref(ledger_id, metadata)
    if ref is not None and is_released(metadata):
        return StoreEntryReader(ledger_id, digest, objects, ref, ctx.config, ctx.stats)
    return TieredEntryReader(ledger_id, digest, ctx.pool, ctx.config, ctx.stats, ctx.store, objects)


__all__ = ["StoreEntryReader", "TieredEntryReader", "entry_source"]
