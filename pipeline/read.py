"""Batch reads of logs (or of given ledgers), and the rows every read task produces.

Reading never fences or recovers anything: an open ledger is read up to its LAC, so a batch
read sees exactly what was acknowledged when it was planned. Which logs, from where and to
where: ``aiobk.pipeline.positions``.

A row: ``log, ledger_id, entry_id, data, key, headers, timestamp, position``. In a log of
envelope records ``key``, ``headers`` and ``timestamp`` are the writer's (``timestamp`` as a
Spark timestamp, from the record's milliseconds); in a raw log, and in ledgers read by id,
they are null.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from aiobk.client import BookKeeper
from aiobk.client.log_format import ENVELOPE, RAW, RecordFormatError, decode
from aiobk.pipeline.options import Options
from aiobk.pipeline.positions import (
    LedgerRange,
    checked_start,
    resolve,
    select_logs,
    split_ranges,
    view,
)
from aiobk.protocol.errors import NoSuchLedgerError

READ_BATCH = 1000  # entries per read request of a task
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def spark_time(milliseconds: int) -> datetime.datetime | None:
    """A record's time as Spark's timestamp takes it (None past the years 1-9999 it holds)."""
    try:
        return EPOCH + datetime.timedelta(milliseconds=milliseconds)
    except OverflowError:
        return None


def rows_of(part: LedgerRange, entries: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The rows of ``entries`` (``Entry`` objects) read from ``part``."""
    name, ledger_id = part.log, part.ledger_id
    if part.record_format == RAW:
        return [
            (name, ledger_id, e.entry_id, e.data, None, None, None, f"{ledger_id}:{e.entry_id}")
            for e in entries
        ]
    assert part.record_format == ENVELOPE
    rows = []
    for e in entries:
        try:
            record = decode(e.data)
        except RecordFormatError as exc:
            raise RecordFormatError(
                f"log {name!r}: the record at {ledger_id}:{e.entry_id}: {exc}"
            ) from None
        rows.append(
            (
                name, ledger_id, e.entry_id, record.data, record.key, dict(record.headers),
                spark_time(record.timestamp), f"{ledger_id}:{e.entry_id}",
            )
        )  # fmt: skip
    return rows


def read_range(opts: Options, part: LedgerRange) -> Iterator[tuple[Any, ...]]:
    """One task: the rows of ``part``."""

    async def fetch(bk: BookKeeper) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        handle = await bk.open_ledger(part.ledger_id, opts.password, recovery=False)
        for lo in range(part.first, part.last + 1, READ_BATCH):
            entries = await handle.read_unconfirmed(lo, min(part.last, lo + READ_BATCH - 1))
            rows += rows_of(part, entries)
        return rows

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
            ranges.append(LedgerRange(None, ledger_id, 0, handle.last_add_confirmed, RAW))
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

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, LedgerRange)
        return read_range(self.opts, partition)


__all__ = ["BatchReader", "LedgerRange", "plan_batch", "read_range", "rows_of", "spark_time"]
