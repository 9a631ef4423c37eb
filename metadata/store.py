"""The metadata store: ledgers, ids, bookie registry, cookies and logs, over one ``KV``.
The families of records are parts of their own (``key_space`` says how they fit).

Every update is a compare-and-set on the version the caller read (the key's mod revision); a
lost race raises ``MetadataVersionError`` and the caller re-reads (``update_ledger`` runs that
loop with a retry budget). The client and the bookie use only this class: neither touches etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

from aiobk.metadata.autorecovery import AutoRecoveryStore
from aiobk.metadata.bookie_records import DEFAULT_BOOKIE_TTL, BookieRecords
from aiobk.metadata.keys import KeyLayout
from aiobk.metadata.kv import KV, KeyExistsError, KeyMissingError, RevisionMismatchError
from aiobk.metadata.listing import walk_ids
from aiobk.metadata.log_records import LogRecords
from aiobk.metadata.model import LedgerMetadata, MetadataFormatError
from aiobk.metadata.offload_records import OffloadRecords
from aiobk.metadata.records import ClusterRecord
from aiobk.protocol.errors import (
    LedgerExistsError,
    MetadataVersionError,
    NoSuchClusterError,
    NoSuchLedgerError,
)

__all__ = ["DEFAULT_BOOKIE_TTL", "MetadataStore"]


class MetadataStore(BookieRecords, OffloadRecords, LogRecords):
    """Every record of one cluster: the cluster record and ledgers (here), bookies and cookies
    (``BookieRecords``), logs (``LogRecords``), offloading's store and work list
    (``OffloadRecords``), and autorecovery's keys (``autorecovery``)."""

    def __init__(self, kv: KV, prefix: str = "aiobk", uri: str = "") -> None:
        super().__init__(kv, KeyLayout(prefix))
        self.uri = uri or kv.description
        self.autorecovery = AutoRecoveryStore(kv, self.keys)

    async def close(self) -> None:
        for watch in list(self._watches):
            await watch.close()
        await self.kv.close()

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ history

    async def compact_history(self, keep: int) -> int:
        """Let the store forget all but the last ``keep`` revisions of history (etcd keeps
        every revision until compacted, and refuses all writes once its database reaches its
        quota). Watches start from a revision just read, so they need little history; one
        that falls ``keep`` revisions behind fails and its owner reads again. Returns the
        revision compacted to (0: nothing to do yet). Every bookie calls this after its GC
        pass: compacting to an older revision than another did is a no-op."""
        _found, revision = await self.kv.get(self.keys.idgen)
        target = revision - keep
        if keep <= 0 or target <= 0:
            return 0
        await self.kv.compact(target)
        return target

    # ------------------------------------------------------------------ the cluster

    async def read_cluster(self) -> ClusterRecord | None:
        """The cluster record (None: the prefix has none)."""
        found, _revision = await self.kv.get(self.keys.cluster)
        if found is None:
            return None
        return ClusterRecord.from_json(found.value, found.mod_revision)

    async def set_up_cluster(self, instance_id: str) -> ClusterRecord:
        """The cluster record, written now with ``instance_id`` when the prefix has none: by
        the first bookie that boots under the prefix, or by the first to boot with this version
        in a cluster set up before the record existed. An existing record never changes."""
        found = await self.read_cluster()
        if found is not None:
            return found
        record = ClusterRecord(instance_id)
        try:
            version = await self.kv.create(self.keys.cluster, record.to_json())
        except KeyExistsError:  # another bookie set the cluster up meanwhile: its record holds
            found = await self.read_cluster()
            if found is None:
                raise MetadataVersionError(
                    "the cluster record vanished as it was written"
                ) from None
            return found
        return dataclasses.replace(record, version=version)

    async def check_cluster(self) -> ClusterRecord | None:
        """The cluster record; None for a cluster set up before the record existed, known by
        the keys its bookies, clients and autorecovery wrote (cookies, registrations, ledgers,
        logs, autorecovery's keys, the id counter); ``NoSuchClusterError`` when the prefix
        holds no cluster at all."""
        found = await self.read_cluster()
        if found is not None:
            return found
        keys = self.keys
        for prefix in (keys.cookies, keys.bookies, keys.ledgers, keys.logs, keys.autorecovery):
            page, _revision = await self.kv.range(prefix, None, 1, keys_only=True)
            if page:
                return None
        counter, _revision = await self.kv.get(keys.idgen)
        if counter is not None:
            return None
        where = "" if self.uri.startswith("memory://") else f" under prefix {keys.root.decode()}"
        raise NoSuchClusterError(
            f"{self.uri}: no aiobk cluster was ever set up{where} (no bookie has started with "
            "this metadata URI); check it"
        )

    # ------------------------------------------------------------------ ledgers

    async def allocate_ledger_id(self) -> int:
        """A ledger id no other client will get (the revision of one write to the counter)."""
        return await self.kv.bump(self.keys.idgen)

    async def create_ledger(self, ledger_id: int, metadata: LedgerMetadata) -> LedgerMetadata:
        """Store a new ledger; LedgerExistsError if the id is taken."""
        try:
            version = await self.kv.create(self.keys.ledger(ledger_id), metadata.to_json())
        except KeyExistsError:
            raise LedgerExistsError(f"ledger {ledger_id} already exists") from None
        return metadata.with_version(version)

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        found, _revision = await self.kv.get(self.keys.ledger(ledger_id))
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.from_json(found.value, found.mod_revision)

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata) -> LedgerMetadata:
        """Replace the ledger's metadata if it is still at ``metadata.version``."""
        key = self.keys.ledger(ledger_id)
        try:
            version = await self.kv.compare_and_set(key, metadata.to_json(), metadata.version)
        except KeyMissingError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        except RevisionMismatchError as exc:
            raise MetadataVersionError(
                f"ledger {ledger_id} changed: at version {exc.actual}, not {metadata.version}"
            ) from None
        return metadata.with_version(version)

    async def update_ledger(
        self,
        ledger_id: int,
        change: Callable[[LedgerMetadata], LedgerMetadata | None],
        retries: int = 20,
    ) -> LedgerMetadata:
        """Read-modify-write until it lands. ``change`` returns None to leave it as it is."""
        for _attempt in range(retries):
            current = await self.read_ledger(ledger_id)
            wanted = change(current)
            if wanted is None:
                return current
            try:
                return await self.write_ledger(ledger_id, wanted.with_version(current.version))
            except MetadataVersionError:
                await asyncio.sleep(0)
        raise MetadataVersionError(f"ledger {ledger_id}: still racing after {retries} attempts")

    async def delete_ledger(self, ledger_id: int, version: int | None = None) -> None:
        try:
            await self.kv.delete(self.keys.ledger(ledger_id), version)
        except KeyMissingError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        except RevisionMismatchError as exc:
            raise MetadataVersionError(
                f"ledger {ledger_id} changed: at version {exc.actual}, not {version}"
            ) from None

    async def list_ledgers(self, page_size: int = 1000) -> AsyncIterator[int]:
        """Every ledger id in ascending order, fetched a page at a time (keys only), through
        windows of ids (``metadata.listing``: etcd counts a limited range to its end)."""
        keys = self.keys
        async for item in walk_ids(self.kv, keys.ledgers, keys.ledger, page_size, keys_only=True):
            yield keys.ledger_id(item.key)

    async def scan_ledgers(
        self, page_size: int = 500
    ) -> AsyncIterator[tuple[int, LedgerMetadata | None]]:
        """Every ledger with its metadata, ascending, a page at a time (the auditor's walk);
        None for metadata this version cannot read (the walk goes on past it)."""
        keys = self.keys
        async for item in walk_ids(self.kv, keys.ledgers, keys.ledger, page_size, keys_only=False):
            try:
                metadata: LedgerMetadata | None = LedgerMetadata.from_json(
                    item.value, item.mod_revision
                )
            except MetadataFormatError:
                metadata = None
            yield keys.ledger_id(item.key), metadata

    async def watch_ledger(self, ledger_id: int) -> AsyncIterator[LedgerMetadata | None]:
        """The ledger's metadata now, then after every change (None once deleted)."""
        async with contextlib.aclosing(self._follow(self.keys.ledger(ledger_id))) as states:
            async for found in states:
                yield (
                    None
                    if found is None
                    else LedgerMetadata.from_json(found.value, found.mod_revision)
                )
