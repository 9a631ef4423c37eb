"""The seam under the bookie's on-disk index (BookKeeper's DbLedgerStorage-class storage): an
ordered key-value store whose batches are atomic and durable.

Theory of operation. The index will map (ledger, entry) -> entry-log location and keep each
ledger's state, in an engine chosen by measurement (``aiobk bench index``: RocksDB). Like the
metadata package's KV seam, the engine sits behind an interface with two implementations and
one contract test (tests/bookie/test_index_db.py):

- ``RocksIndexDb`` (bookie.index.rocks): RocksDB through rocksdict, memory bounded by its
  block cache and write buffers; each batch is one WriteBatch written with ``sync`` (WAL
  fsynced) on a thread of its own, so the event loop never waits on the disk.
- ``LogIndexDb`` (bookie.index.twin): the twin the deterministic simulator runs -- a log of
  batches on the bookie's ``Disk`` seam, so a simulated crash keeps exactly what the simulated
  disk synced: the last whole batch, never part of one.

What both promise: ``write(batch)`` applies every operation of the batch or none, and once it
returns the batch survives a crash; ``get`` and ``scan`` see every returned write (reads are
synchronous: point lookups are microseconds, served from memory or the engine's cache). Damage
the engine detects (a checksum) is ``IndexCorruptError``, at open or at the read that meets it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field

PUT, DELETE, DELETE_RANGE = 0, 1, 2


class IndexCorruptError(Exception):
    """The index is damaged; the bookie must not guess what it held."""


@dataclass
class IndexBatch:
    """Operations applied together by ``IndexDb.write``, in order."""

    ops: list[tuple[int, bytes, bytes]] = field(default_factory=list)

    def put(self, key: bytes, value: bytes) -> None:
        self.ops.append((PUT, key, value))

    def delete(self, key: bytes) -> None:
        self.ops.append((DELETE, key, b""))

    def delete_range(self, start: bytes, end: bytes) -> None:
        """Every key in [start, end)."""
        self.ops.append((DELETE_RANGE, start, end))

    def __len__(self) -> int:
        return len(self.ops)


class IndexDb(abc.ABC):
    @abc.abstractmethod
    def get(self, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end), ascending, with their values."""

    @abc.abstractmethod
    async def write(self, batch: IndexBatch) -> None:
        """Apply the batch atomically; durable when this returns."""

    @abc.abstractmethod
    async def close(self) -> None: ...


__all__ = ["DELETE", "DELETE_RANGE", "PUT", "IndexBatch", "IndexCorruptError", "IndexDb"]
