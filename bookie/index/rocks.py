"""``RocksIndexDb``: the bookie index's engine, RocksDB through rocksdict (bookie.index.engine has
the contract; ``aiobk bench index`` the figures that chose it).

Memory is bounded by configuration: the block cache (``cache_bytes``, which also holds the
index and bloom-filter blocks, so they do not grow outside it with the data) and the memtables
(``write_buffer`` each, RocksDB's default two of them). A bloom filter per table makes a lookup
of a key that is not there (a deleted ledger, one not held) cost no block read -- in every
family but the ledger records and locations, whose lookups are of keys that exist (``__init__``
says why they keep none); index and filters are partitioned, so a lookup loads pieces of them
(``INDEX_PARTITION_BYTES``), whatever the database's size.

Column families. A checkpoint writes new keys at the top of several key ranges at once (for a
new ledger: its record and locations under ``E``, its ``H`` and ``G`` keys; then the mark). In
one LSM tree each flushed file then spans from the first of those ranges to the last, overlaps
everything between them in the level below, and each compaction rewrites most of the index: at a
million ledgers every L0 compaction read and wrote the whole of it (10 million records, 80 MB,
5 s of CPU on this machine; RocksDB's LOG in a 1,000,000-ledger ``bench scale`` run), a cost
that grows with the data held. So each growing key prefix of ``bookie.index.entry_index`` has a
column family of its own (``FAMILIES``), where a flushed file holds only keys at that family's
top and compaction moves it down without rewriting older ones; everything else (the mark and
its companions) stays in the default family. The memtables of all families together stay
within ``2 * write_buffer`` (``db_write_buffer_size``), as one family's two did. An index made
before the families holds every key in the default family: opening it moves them into their
families, a chunk per atomic batch (a crash between chunks leaves each key in exactly one
family, and the next open goes on).

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
import logging
import time
from collections.abc import Iterator
from typing import Any

from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from aiobk.bookie.index.engine import DELETE, PUT, IndexBatch, IndexCorruptError, IndexDb

log = logging.getLogger(__name__)

INDEX_PARTITION_BYTES = 64 * 1024
# The growing key prefixes of bookie.index.entry_index, each in a column family of its own (see the
# module docstring); keys of any other first byte live in the default family.
FAMILIES = {ord("E"): "entries", ord("H"): "held", ord("D"): "deleted", ord("G"): "log_ledgers"}
MOVE_CHUNK = 20_000  # keys a batch when an index made before the families is opened


def _options(cache: Cache, write_buffer: int, *, filters: bool) -> Options:
    """A family's options: tables whose index (and filters, if any) are partitioned and held in
    ``cache`` (the module docstring)."""
    options = Options(raw_mode=True)
    options.set_write_buffer_size(write_buffer)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    if filters:
        table.set_bloom_filter(10, False)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    # Partitioned index and filters (RocksDB's advice for large databases): a lookup loads
    # one partition, not a table's whole filter. Without it, at 10,000,000 keys and a
    # cache smaller than the filters, every lookup reloaded and re-checksummed a filter of
    # megabytes: 250 us to 4.5 ms a lookup against 2-13 us (a bookie holding a million
    # ledgers, where it held adds to half their rate).
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_pin_top_level_index_and_filter(True)
    # Partitions are loaded on a lookup's first need and stay in the block cache, so a
    # restarted bookie's first reads each pay one more disk read until its tables' index
    # is in. At 4 KiB a table of a million ledgers had hundreds of partitions; at 16 KiB a
    # quarter as many, each still one read: 3.26 read calls a cold read against 3.84, p50
    # 2.81x a cold pread against 3.03x (two 1M-ledger bench scale runs, README). At 64 KiB
    # the entries family of a kept 1M-ledger index has 27 partitions (105 at 16 KiB): a cold
    # lookup's p90 97-101 us against 169-195, its p50 78 against 82-84 (a pread: 64-68).
    table.set_metadata_block_size(INDEX_PARTITION_BYTES)
    options.set_block_based_table_factory(table)
    # No filters in the last level, where most keys live: lookups there are for keys that
    # exist (a stored entry, a held ledger's record), which a filter cannot spare a block
    # read, and on a cold start each filter costs a partition read of its own. Lookups of
    # keys that are not there (a new ledger) land above it or past its key range.
    options.set_optimize_filters_for_hits(True)
    return options


class RocksIndexDb(IndexDb):
    """RocksDB through rocksdict (see the module docstring)."""

    def __init__(
        self, path: str, *, cache_bytes: int = 64 << 20, write_buffer: int = 16 << 20
    ) -> None:
        cache = Cache(cache_bytes)  # one block cache for every family
        options = _options(cache, write_buffer, filters=True)
        # All families' memtables together within what one family's two took; and the log no
        # larger than they are, as with one family: a family written seldom (the mark, the
        # deleted ledgers) would otherwise keep old log files on disk (64 MiB of them at a
        # limit of 4x: 0.85x -> 1.00x of bench scale's storage allowance at 100,000 ledgers).
        options.set_db_write_buffer_size(2 * write_buffer)
        options.set_max_total_wal_size(2 * write_buffer)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        # The entries family keeps no bloom filters. Nearly all its lookups are of keys that
        # exist (a held ledger's record, a stored entry's location); of the others, a new
        # ledger's record sorts above every key held, where the tables' key ranges turn it
        # away unread, and an entry past a ledger's last sorts into the block holding that
        # ledger's keys, which its reader has just read. And filters cost cold reads a read:
        # with filters RocksDB cuts an index partition wherever a filter partition ends (about
        # 2 KiB of index, not 16), and a flushed table keeps both when it is moved down
        # unchanged. A kept 1,000,000-ledger bench scale index had 993 index partitions and
        # 7 MB of filters in its entries family (105 and none once compacted), and 55% of its
        # cold reads loaded a partition: 3.56x a cold pread, against 2.77x compacted.
        self._families = {
            name: _options(cache, write_buffer, filters=name != FAMILIES[ord("E")])
            for name in FAMILIES.values()
        }
        self._path, self._options = path, options
        self._sync = WriteOptions()
        self._sync.sync = True
        self._open()
        self._move_into_families()
        self._failed = False  # a write failed: RocksDB refuses writes until reopened
        self._lock = asyncio.Lock()  # one batch at a time, in order

    @classmethod
    async def open(
        cls, path: str, *, cache_bytes: int = 64 << 20, write_buffer: int = 16 << 20
    ) -> RocksIndexDb:
        """Open (or create) the database off the event loop: opening replays RocksDB's log."""
        return await asyncio.to_thread(
            cls, path, cache_bytes=cache_bytes, write_buffer=write_buffer
        )

    def _open(self) -> None:
        path, options = self._path, self._options
        try:
            self._db = Rdict(path, options, column_families=self._families)
            # first byte -> the family's handle (for batches) and its view (for reads)
            self._handles: dict[int, Any] = {
                first: self._db.get_column_family_handle(name) for first, name in FAMILIES.items()
            }
            self._views: dict[int, Rdict] = {
                first: self._db.get_column_family(name) for first, name in FAMILIES.items()
            }
        except Exception as exc:
            raise _os_error(exc, path) from exc

    def _move_into_families(self) -> None:
        """Move the keys an index made before the families holds in the default family (module
        docstring): each chunk is put into its family and deleted from the default in one
        synced batch."""
        db = self._db
        for first, name in FAMILIES.items():
            prefix, moved, started = bytes([first]), 0, time.monotonic()
            while True:  # bounded: every turn moves a chunk out of the default family, or stops
                try:
                    chunk = self._default_range(prefix, bytes([first + 1]), MOVE_CHUNK)
                except Exception as exc:
                    raise _os_error(exc, self._path) from exc
                if not chunk:
                    break
                if not moved:
                    log.info("index %s: moving the %r keys into column family %s", self._path,
                             prefix, name)  # fmt: skip
                rocks = WriteBatch(raw_mode=True)
                handle = self._handles[first]
                for key, value in chunk:
                    rocks.put(key, value, handle)
                rocks.delete_range(chunk[0][0], chunk[-1][0] + b"\0")  # exactly the chunk
                try:
                    db.write(rocks, self._sync)
                except Exception as exc:
                    raise _os_error(exc, self._path) from exc
                moved += len(chunk)
            if moved:
                with contextlib.suppress(Exception):  # reclaims space only (RocksDB would, in time)
                    db.compact_range(prefix, bytes([first + 1]))
                log.info("index %s: moved %d keys into %s in %.1f s", self._path, moved, name,
                         time.monotonic() - started)  # fmt: skip

    def _default_range(self, start: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(start)
        out: list[tuple[bytes, bytes]] = []
        while it.valid() and len(out) < limit:
            key = bytes(it.key())
            if key >= end:
                break
            out.append((key, bytes(it.value())))
            it.next()
        it.status()
        return out

    def _segments(self, start: bytes, end: bytes) -> Iterator[tuple[Rdict, bytes, bytes]]:
        """[start, end) cut where it enters or leaves a family's prefix: (where its keys live,
        from, to), ascending."""
        while start < end:
            first = start[0] if start else -1
            if first in self._views:
                stop = min(end, bytes([first + 1]))
                yield self._views[first], start, stop
            else:  # up to the next family's prefix, in the default family
                nxt = min((f for f in self._views if f > first), default=None)
                stop = end if nxt is None else min(end, bytes([nxt]))
                yield self._db, start, stop
            start = stop

    def background_work(self) -> int:
        """Flushes and compactions RocksDB is running or has pending, over every family (0:
        settled). After a burst of changes -- a GC pass's deletes -- it compacts for a while
        after opening; a benchmark of cold reads waits for that first."""
        db = self._db
        work = sum(
            db.property_int_value(name) or 0
            for name in ("rocksdb.num-running-compactions", "rocksdb.num-running-flushes")
        )
        for view in (db, *self._views.values()):
            work += sum(
                view.property_int_value(name) or 0
                for name in ("rocksdb.compaction-pending", "rocksdb.mem-table-flush-pending")
            )
        return work

    def get(self, key: bytes) -> bytes | None:
        try:
            value = self._views.get(key[0] if key else -1, self._db).get(key)
        except Exception as exc:
            raise _os_error(exc, self._path) from exc
        return None if value is None else bytes(value)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        try:
            for source, low, high in self._segments(start, end):
                it = source.iter()
                it.seek(low)
                while it.valid():
                    key = bytes(it.key())
                    if key >= high:
                        break
                    yield key, bytes(it.value())
                    it.next()
                it.status()
        except Exception as exc:
            raise _os_error(exc, self._path) from exc

    def write_now(self, batch: IndexBatch) -> None:
        """``write``, blocking the caller (benchmarks; the bookie uses ``write``)."""
        rocks = WriteBatch(raw_mode=True)
        handles = self._handles
        for op, key, value in batch.ops:
            if op == PUT:
                rocks.put(key, value, handles.get(key[0] if key else -1))
            elif op == DELETE:
                rocks.delete(key, handles.get(key[0] if key else -1))
            else:
                for source, low, high in self._segments(key, value):
                    handle = None if source is self._db else handles[low[0]]
                    rocks.delete_range(low, high, handle)
        try:
            self._db.write(rocks, self._sync)
        except Exception as exc:
            raise _os_error(exc, self._path) from exc

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
        self._release()
        self._open()
        self._failed = False

    async def close(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        try:
            self._release(flush=True)
        except Exception as exc:  # the last flush failed: the database is closed all the same
            raise _os_error(exc, self._path) from exc

    def _release(self, *, flush: bool = False) -> None:
        """Close the database; the families' views and handles go first (each holds it open,
        and a later open in this process would find it locked)."""
        views = list(self._views.values())
        self._views, self._handles = {}, {}
        try:
            if flush:
                for view in views:
                    view.flush()
                self._db.flush()
        finally:
            del views
            with contextlib.suppress(Exception):
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
