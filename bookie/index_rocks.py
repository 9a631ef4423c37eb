"""``RocksIndexDb``: the bookie index's engine, RocksDB through rocksdict (bookie.index_db has
the contract; ``aiobk bench index`` the figures that chose it).

Memory is bounded by configuration: the block cache (``cache_bytes``, which also holds the
index and bloom-filter blocks, so they do not grow outside it with the data) and the memtables
(``write_buffer`` each, RocksDB's default two of them). A bloom filter per table makes a lookup
of a key that is not there (a new ledger, a deleted one) cost no block read; index and filters
are partitioned, so a lookup loads small pieces of them, whatever the database's size.

RocksDB's errors arrive as plain exceptions; a write or open that fails is raised as ``OSError``
(ENOSPC when the disk is full), which is what the bookie's disk handling expects of storage.

Each batch is one WriteBatch written with ``sync`` -- the write-ahead log fsynced -- on a
worker thread, one batch at a time, so the event loop never waits on the disk; point lookups
and scans run inline (microseconds from the cache; a miss reads one block).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Iterator

from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from aiobk.bookie.index_db import DELETE, PUT, IndexBatch, IndexCorruptError, IndexDb

INDEX_PARTITION_BYTES = 16 * 1024


class RocksIndexDb(IndexDb):
    """RocksDB through rocksdict (see the module docstring)."""

    def __init__(
        self, path: str, *, cache_bytes: int = 64 << 20, write_buffer: int = 16 << 20
    ) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(write_buffer)
        table = BlockBasedOptions()
        table.set_block_cache(Cache(cache_bytes))
        table.set_bloom_filter(10, False)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        # Partitioned index and filters (RocksDB's advice for large databases): a lookup loads
        # one partition, not a table's whole filter. Without it, at 10,000,000 keys and a
        # cache smaller than the filters, every lookup reloaded and re-checksummed a filter of
        # megabytes: 250 us to 4.5 ms a lookup against 2-13 us (issue 15's scale run).
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_pin_top_level_index_and_filter(True)
        # Partitions are loaded on a lookup's first need and stay in the block cache, so a
        # restarted bookie's first reads each pay one more disk read until its tables' index
        # is in. At 4 KiB a table of a million ledgers had hundreds of partitions; at 16 KiB a
        # quarter as many, each still one read: 3.26 read calls a cold read against 3.84, p50
        # 2.81x a cold pread against 3.03x (two 1M-ledger bench scale runs, README).
        table.set_metadata_block_size(INDEX_PARTITION_BYTES)
        options.set_block_based_table_factory(table)
        # No filters in the last level, where most keys live: lookups there are for keys that
        # exist (a stored entry, a held ledger's record), which a filter cannot spare a block
        # read, and on a cold start each filter costs a partition read of its own. Lookups of
        # keys that are not there (a new ledger) land above it or past its key range.
        options.set_optimize_filters_for_hits(True)
        self._path, self._options = path, options
        try:
            self._db = Rdict(path, options)
        except Exception as exc:
            raise _os_error(exc, path) from exc
        self._failed = False  # a write failed: RocksDB refuses writes until reopened
        self._sync = WriteOptions()
        self._sync.sync = True
        self._lock = asyncio.Lock()  # one batch at a time, in order

    @classmethod
    async def open(
        cls, path: str, *, cache_bytes: int = 64 << 20, write_buffer: int = 16 << 20
    ) -> RocksIndexDb:
        """Open (or create) the database off the event loop: opening replays RocksDB's log."""
        return await asyncio.to_thread(
            cls, path, cache_bytes=cache_bytes, write_buffer=write_buffer
        )

    def get(self, key: bytes) -> bytes | None:
        try:
            value = self._db.get(key)
        except Exception as exc:
            raise _os_error(exc, self._db.path()) from exc
        return None if value is None else bytes(value)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        try:
            it = self._db.iter()
            it.seek(start)
            while it.valid():
                key = bytes(it.key())
                if key >= end:
                    return
                yield key, bytes(it.value())
                it.next()
            it.status()
        except Exception as exc:
            raise _os_error(exc, self._db.path()) from exc

    def write_now(self, batch: IndexBatch) -> None:
        """``write``, blocking the caller (benchmarks; the bookie uses ``write``)."""
        rocks = WriteBatch(raw_mode=True)
        for op, key, value in batch.ops:
            if op == PUT:
                rocks.put(key, value)
            elif op == DELETE:
                rocks.delete(key)
            else:
                rocks.delete_range(key, value)
        try:
            self._db.write(rocks, self._sync)
        except Exception as exc:
            raise _os_error(exc, self._db.path()) from exc

    async def write(self, batch: IndexBatch) -> None:
        async with self._lock:
            if self._failed:
                self._reopen()
            try:
                await asyncio.to_thread(self.write_now, batch)
            except OSError:
                self._failed = True
                raise

    def _reopen(self) -> None:
        """After a failed write (a full disk) RocksDB stays in its background-error state and
        refuses every later write; closing and opening it again (its log and tables are whole)
        clears that, so checkpoints resume once there is room. On the event loop's thread,
        where lookups run, so no lookup meets a closed handle."""
        with contextlib.suppress(Exception):
            self._db.close()
        try:
            self._db = Rdict(self._path, self._options)
        except Exception as exc:
            raise _os_error(exc, self._path) from exc
        self._failed = False

    async def close(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        self._db.flush()
        self._db.close()


def _os_error(exc: Exception, path: str) -> Exception:
    """RocksDB's exception as the bookie's: damage is IndexCorruptError, the rest OSError."""
    if isinstance(exc, (OSError, IndexCorruptError)):
        return exc
    message = str(exc)
    if message.startswith("Corruption"):
        return IndexCorruptError(f"index database {path}: {message}")
    code = errno.ENOSPC if "No space" in message else errno.EIO
    return OSError(code, f"index database: {message}", path)


__all__ = ["RocksIndexDb"]
