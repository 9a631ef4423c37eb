"""Offloading's records in the metadata store: the cluster's offload store (one key), the work
list of ledgers with an offload record or an attempt at one (one empty key per ledger), and a
log's offload policy (a field of its log record).

The work list exists so that whatever acts on offloaded ledgers -- the pass that releases
copied ledgers and retries dead attempts, a bookie's garbage collection, crash repair -- walks
only those ledgers' keys, never every ledger's metadata. A ledger's key is added before the
compare-and-set that starts its copy and removed with the ledger or an abandoned attempt; both
are idempotent, so a crash between a step and the next is repaired by doing the step again.
The ledger's ``OffloadRecord`` itself changes only through ``update_ledger``, the one write
path of ledger metadata.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from aiobk.metadata.keys import KeyLayout
from aiobk.metadata.kv import KeyExistsError, KeyMissingError, RevisionMismatchError
from aiobk.metadata.listing import walk_ids
from aiobk.metadata.log_records import LogRecords
from aiobk.metadata.records import (
    LogMetadata,
    OffloadPolicy,
    OffloadStoreSettings,
    check_offload_url,
)
from aiobk.protocol.errors import MetadataVersionError


class OffloadRecords(LogRecords):
    """Offloading's keys (part of ``MetadataStore``); a log's policy is written through the
    log records' compare-and-set."""

    async def read_offload_store(self) -> OffloadStoreSettings | None:
        """The cluster's offload store (None: none was ever set)."""
        found, _revision = await self.kv.get(self.keys.offload_store)
        if found is None:
            return None
        return OffloadStoreSettings.from_json(found.value, found.mod_revision)

    async def set_offload_store(self, settings: OffloadStoreSettings, retries: int = 20) -> None:
        """Make ``settings`` the cluster's offload store, whatever was set before (the last
        writer wins), by compare-and-set on the record read, so fields a newer version wrote
        there are kept. ValueError, on one line, for a URL that is not ``file://`` or
        ``s3://``; the object-store layer checks the rest of it."""
        check_offload_url(settings.url)
        key = self.keys.offload_store
        for _attempt in range(retries):
            current = await self.read_offload_store()
            try:
                if current is None:
                    await self.kv.create(key, settings.to_json())
                else:
                    merged = dataclasses.replace(
                        settings, extra={**current.extra, **settings.extra}
                    )
                    await self.kv.compare_and_set(key, merged.to_json(), current.version)
            except (KeyExistsError, KeyMissingError, RevisionMismatchError):
                await asyncio.sleep(0)
                continue
            return
        raise MetadataVersionError(
            f"the offload store record: still racing after {retries} attempts"
        )

    async def add_offloading(self, ledger_id: int, listed_at: int = 0, retries: int = 20) -> None:
        """Put the ledger on the work list, stamped with ``listed_at`` (milliseconds): an
        entry whose ledger never got an offload record is dropped only once its stamp is old,
        so an offloader between listing a ledger and recording its attempt is never undone.
        Listing a ledger already there stamps it again."""
        key = self.keys.offloading(ledger_id)
        value = str(listed_at).encode() if listed_at else b""
        for _attempt in range(retries):
            found, _revision = await self.kv.get(key)
            try:
                if found is None:
                    await self.kv.create(key, value)
                elif found.value != value:
                    await self.kv.compare_and_set(key, value, found.mod_revision)
            except (KeyExistsError, KeyMissingError, RevisionMismatchError):
                await asyncio.sleep(0)
                continue
            return
        raise MetadataVersionError(f"ledger {ledger_id}: listing it kept losing races")

    async def offloading_since(self, ledger_id: int) -> tuple[int, int] | None:
        """When the ledger was last put on the work list (milliseconds; 0: not stamped) and
        the entry's revision, for ``remove_offloading``; None when it is not on the list."""
        found, _revision = await self.kv.get(self.keys.offloading(ledger_id))
        if found is None:
            return None
        try:
            listed_at = int(found.value or b"0")
        except ValueError:
            listed_at = 0  # not a stamp this version wrote: as old as can be
        return listed_at, found.mod_revision

    async def remove_offloading(self, ledger_id: int, revision: int | None = None) -> bool:
        """Take the ledger off the work list (not there: nothing changes); with ``revision``,
        only if the entry is still at it. Whether an entry was removed."""
        try:
            await self.kv.delete(self.keys.offloading(ledger_id), revision)
        except (KeyMissingError, RevisionMismatchError):
            return False
        return True

    async def list_offloading(self, page_size: int = 1000) -> AsyncIterator[int]:
        """The ledger ids on the work list, ascending, a page of keys at a time (keys only,
        through windows of ids as ``list_ledgers`` walks: ``metadata.listing``)."""
        prefix = self.keys.offloading_prefix
        async for item in walk_ids(
            self.kv, prefix, self.keys.offloading, page_size, keys_only=True
        ):
            yield KeyLayout.ledger_id_of(prefix, item.key)

    async def set_offload_policy(
        self, name: str, policy: OffloadPolicy | None, retries: int = 20
    ) -> LogMetadata:
        """Set the log's offload policy (None: none), re-reading the log record after every
        lost race, as a roll or a truncation does; the record as written (or as found, when it
        already had that policy). Everything else in the record is kept."""
        for _attempt in range(retries):
            record = await self.read_log(name)
            if record.offload_policy == policy:
                return record
            try:
                return await self.write_log(record.with_offload_policy(policy))
            except MetadataVersionError:
                await asyncio.sleep(0)
        raise MetadataVersionError(f"log {name!r}: setting its offload policy kept losing races")
