"""Logs' records in the metadata store: one key per log, holding its ledger list and what its
writers and retention agreed on (``LogMetadata``); every change is a compare-and-set."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

from aiobk.metadata.key_space import KeySpace
from aiobk.metadata.kv import KeyExistsError, KeyMissingError, RevisionMismatchError
from aiobk.metadata.records import LogMetadata
from aiobk.protocol.errors import LogExistsError, MetadataVersionError, NoSuchLogError


class LogRecords(KeySpace):
    """The logs' records (part of ``MetadataStore``)."""

    async def create_log(self, name: str, record_format: str = "raw") -> LogMetadata:
        record = LogMetadata(name, record_format=record_format)
        try:
            version = await self.kv.create(self.keys.log(name), record.to_json())
        except KeyExistsError:
            raise LogExistsError(f"log {name!r} already exists") from None
        return dataclasses.replace(record, version=version)

    async def read_log(self, name: str) -> LogMetadata:
        found, _revision = await self.kv.get(self.keys.log(name))
        if found is None:
            raise NoSuchLogError(f"log {name!r} does not exist")
        return LogMetadata.from_json(found.value, found.mod_revision)

    async def write_log(self, record: LogMetadata) -> LogMetadata:
        """Replace the log's ledger list if it is still at ``record.version``."""
        try:
            version = await self.kv.compare_and_set(
                self.keys.log(record.name), record.to_json(), record.version
            )
        except KeyMissingError:
            raise NoSuchLogError(f"log {record.name!r} does not exist") from None
        except RevisionMismatchError as exc:
            raise MetadataVersionError(
                f"log {record.name!r} changed: at version {exc.actual}, not {record.version}"
            ) from None
        return dataclasses.replace(record, version=version)

    async def delete_log(self, name: str, version: int | None = None) -> None:
        try:
            await self.kv.delete(self.keys.log(name), version)
        except KeyMissingError:
            raise NoSuchLogError(f"log {name!r} does not exist") from None
        except RevisionMismatchError as exc:
            raise MetadataVersionError(f"log {name!r} changed: {exc}") from None

    async def list_logs(self, page_size: int = 1000) -> AsyncIterator[str]:
        after: bytes | None = None
        while True:
            page, _revision = await self.kv.range(self.keys.logs, after, page_size)
            for item in page:
                yield self.keys.log_name(item.key)
            if len(page) < page_size:
                return
            after = page[-1].key

    async def watch_log(self, name: str) -> AsyncIterator[LogMetadata | None]:
        """The log record now, then after every change (None once deleted)."""
        async with contextlib.aclosing(self._follow(self.keys.log(name))) as states:
            async for found in states:
                yield (
                    None
                    if found is None
                    else LogMetadata.from_json(found.value, found.mod_revision)
                )
