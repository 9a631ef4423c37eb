"""``RocksIndexDb``: the bookie index's engine, RocksDB through rocksdict (bookie.index_db has
the contract; ``aiobk bench index`` the figures that chose it).

Memory is bounded by configuration: the block cache (``cache_bytes``) and the memtables
(``write_buffer`` each, RocksDB's default two of them). Each batch is one WriteBatch written
with ``sync`` -- the write-ahead log fsynced -- on a worker thread, one batch at a time, so the
event loop never waits on the disk; point lookups and scans run inline (microseconds from the
cache; a miss reads one block).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch, WriteOptions

from aiobk.bookie.index_db import DELETE, PUT, IndexBatch, IndexDb


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
        options.set_block_based_table_factory(table)
        self._db = Rdict(path, options)
        self._sync = WriteOptions()
        self._sync.sync = True
        self._lock = asyncio.Lock()  # one batch at a time, in order

    def get(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(start)
        while it.valid():
            key = bytes(it.key())
            if key >= end:
                return
            yield key, bytes(it.value())
            it.next()

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
        self._db.write(rocks, self._sync)

    async def write(self, batch: IndexBatch) -> None:
        async with self._lock:
            await asyncio.to_thread(self.write_now, batch)

    async def close(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        self._db.flush()
        self._db.close()


__all__ = ["RocksIndexDb"]
