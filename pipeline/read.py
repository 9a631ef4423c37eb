"""Batch reads of logs (or of given ledgers), and the rows every read task produces.

Reading never fences or recovers anything: an open ledger is read up to its LAC, so a batch
read sees exactly what was acknowledged when it was planned. Which logs, from where and to
where: ``aiobk.pipeline.positions``.

A row: ``log, ledger_id, entry_id, data, key, headers, timestamp, position, producer_id,
sequence``. In a log of envelope records ``key``, ``headers`` and ``timestamp`` are the
writer's (``timestamp`` as a Spark timestamp, from the record's milliseconds; null outside the
years 1-9999 Spark holds), and ``producer_id`` and ``sequence`` those of the producer that
appended it (docs/design/logs.md, "Producers and exactly-once appends"), null for a plain
record; in a raw log, and in ledgers read by id, all of them are null. Tasks hand Spark Arrow
batches.

A range of an offloaded ledger (``LedgerRange.offload``) is read from its object by the task
itself: the store opened from the URL the ledger's metadata names (credentials from the
executor's environment), the index slice and coalesced body reads of ``ObjectReader``, and each
body checked twice as every reader of an object checks it (``client/store_read.py``): the
object's CRC, then the entry's own digest, a mismatch being the same ``DigestMismatchError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from aiobk.client import BookKeeper, ClientConfig, Entry
from aiobk.client.digest import Digester
from aiobk.client.log.format import ENVELOPE, RAW, RecordFormatError, decode
from aiobk.client.offload import offload_ref
from aiobk.client.store_read import StoreEntryReader
from aiobk.pipeline.options import Options
from aiobk.pipeline.positions import (
    LedgerRange,
    checked_start,
    resolve,
    select_logs,
    split_ranges,
    view,
)
from aiobk.protocol import DigestType
from aiobk.protocol.errors import NoSuchLedgerError
from aiobk.tiered.open import StoreCache

OBJECT_READ_BYTES = 8 * 1024 * 1024  # the most one ranged read of an object fetches

READ_BATCH = 1000  # entries per read request of a task, and rows per Arrow batch
MIN_MS = -62_135_596_800_000  # 0001-01-01, the first instant Spark's timestamps hold
MAX_MS = 253_402_300_799_999  # 9999-12-31 23:59:59.999
HEADERS = pa.map_(pa.string(), pa.binary())
TIMESTAMP = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        ("log", pa.string()), ("ledger_id", pa.int64()), ("entry_id", pa.int64()),
        ("data", pa.binary()), ("key", pa.binary()), ("headers", HEADERS),
        ("timestamp", TIMESTAMP), ("position", pa.string()),
        ("producer_id", pa.string()), ("sequence", pa.int64()),
    ]
)  # fmt: skip


def _micros(milliseconds: int) -> int | None:
    return milliseconds * 1000 if MIN_MS <= milliseconds <= MAX_MS else None


def batch_of(part: LedgerRange, entries: Sequence[Any]) -> pa.RecordBatch:
    """The rows of ``entries`` (``Entry`` objects) read from ``part``, as one Arrow batch: Spark
    takes Arrow columns without converting each value through Python objects."""
    count = len(entries)
    ledger_id = part.ledger_id
    ids = [e.entry_id for e in entries]
    positions = [f"{ledger_id}:{i}" for i in ids]
    if part.record_format == RAW:
        data = [e.data for e in entries]
        keys = pa.nulls(count, pa.binary())
        headers = pa.nulls(count, HEADERS)
        stamps = pa.nulls(count, TIMESTAMP)
        producers = pa.nulls(count, pa.string())
        sequences = pa.nulls(count, pa.int64())
    else:
        assert part.record_format == ENVELOPE
        records = []
        for e in entries:
            try:
                records.append(decode(e.data))
            except RecordFormatError as exc:
                raise RecordFormatError(
                    f"log {part.log!r}: the record at {ledger_id}:{e.entry_id}: {exc}"
                ) from None
        data = [r.data for r in records]
        keys = pa.array([r.key for r in records], pa.binary())
        headers = pa.array([list(r.headers.items()) for r in records], HEADERS)
        stamps = pa.array([_micros(r.timestamp) for r in records], TIMESTAMP)
        producers = pa.array([r.producer_id for r in records], pa.string())
        sequences = pa.array([r.sequence for r in records], pa.int64())
    return pa.RecordBatch.from_arrays(
        [
            pa.array([part.log] * count, pa.string()),
            pa.array([ledger_id] * count, pa.int64()),
            pa.array(ids, pa.int64()),
            pa.array(data, pa.binary()),
            keys,
            headers,
            stamps,
            pa.array(positions, pa.string()),
            producers,
            sequences,
        ],
        schema=ARROW_SCHEMA,
    )


async def fetch_object(part: LedgerRange, password: bytes) -> list[pa.RecordBatch]:
    """The rows of ``part`` (an offloaded ledger's range) from its object, checked as every
    reader of an object checks it (``StoreEntryReader``), a batch per ``READ_BATCH`` entries."""
    ref = part.offload
    assert ref is not None
    objects = StoreCache()
    config = ClientConfig(read_ahead_bytes=OBJECT_READ_BYTES)
    digest = Digester(DigestType(ref.digest_type), password)
    reader = StoreEntryReader(ref.ledger_id, digest, objects, ref, config)
    batches: list[pa.RecordBatch] = []
    entries: list[Entry] = []
    try:
        async for entry in reader.entries(part.first, part.last):
            entries.append(entry)
            if len(entries) == READ_BATCH:
                batches.append(batch_of(part, entries))
                entries = []
    finally:
        await objects.close()
    if entries:
        batches.append(batch_of(part, entries))
    return batches


def read_range(opts: Options, part: LedgerRange) -> Iterator[pa.RecordBatch]:
    """One task: the rows of ``part``, a batch per ``READ_BATCH`` entries."""
    if part.offload is not None:
        if part.last >= part.first:
            yield from asyncio.run(fetch_object(part, opts.password))
        return

    async def fetch(bk: BookKeeper) -> list[pa.RecordBatch]:
        # One stream over the range (reads kept in flight ahead of the consumer, within the
        # client's read window), cut into batches: reading a thousand, then the next thousand,
        # let the reads drain at every boundary.
        batches: list[pa.RecordBatch] = []
        handle = await bk.open_ledger(part.ledger_id, opts.password, recovery=False)
        entries: list[Any] = []
        stream = handle.read_iter(part.first, part.last, unconfirmed=True)  # planned from a LAC
        async with contextlib.aclosing(stream):
            async for entry in stream:
                entries.append(entry)
                if len(entries) == READ_BATCH:
                    batches.append(batch_of(part, entries))
                    entries = []
        if entries:
            batches.append(batch_of(part, entries))
        return batches

    if part.last >= part.first:
        yield from opts.run(fetch)


async def plan_batch(bk: BookKeeper, opts: Options) -> list[LedgerRange]:
    """The ranges a batch read covers (see ``positions``)."""
    ranges: list[LedgerRange] = []
    if opts.ledgers:
        for ledger_id in opts.ledgers:
            try:
                handle = await bk.open_ledger(ledger_id, opts.password, recovery=False)
            except NoSuchLedgerError:
                continue
            ref = offload_ref(ledger_id, handle.metadata)
            ranges.append(LedgerRange(None, ledger_id, 0, handle.last_add_confirmed, RAW, ref))
            await handle.close()
    else:
        for name in await select_logs(bk, opts):
            log_view = await view(bk, opts, name)
            bound = opts.start_positions.get(name, opts.start)
            start = await resolve(bk, opts, log_view, bound, opts.start_time)
            start = checked_start(log_view, start, opts.fail_on_data_loss)
            bound = opts.end_positions.get(name, opts.end)
            end = await resolve(bk, opts, log_view, bound, opts.end_time)
            ranges += log_view.ranges(start, end)
    return split_ranges(ranges, opts.split, opts.min_partitions)


class BatchReader(DataSourceReader):
    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        return opts.run(lambda bk: plan_batch(bk, opts)) or [LedgerRange(None, -1, 0, -1, RAW)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LedgerRange)
        return read_range(self.opts, partition)


__all__ = [
    "ARROW_SCHEMA",
    "BatchReader",
    "LedgerRange",
    "batch_of",
    "plan_batch",
    "read_range",
]
