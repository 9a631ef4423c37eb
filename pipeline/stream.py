"""Streaming reads of logs, with admission control.

An offset names, for every log the query reads, the next record to read:
``{"logs": {NAME: {"ledger": L, "entry": E}}}``. (A checkpoint written before several logs
could be read holds ``{"ledger": L, "entry": E}`` for its one ``log``; it is read as that.) A
micro-batch covers exactly the records between two offsets, so replaying it after a restart from
the checkpoint reads the same records again: with an idempotent or transactional sink, exactly
once. Logs that ``logPattern`` matches later join at their earliest record.

Admission control (``getDefaultReadLimit`` tells Spark a limit is in force; the options decide
it): at most ``maxRecordsPerTrigger`` records and about ``maxBytesPerTrigger`` bytes a batch,
shared among the logs in proportion to what each has waiting (bytes are estimated from each
ledger's average record size: its metadata's length once closed; while open, the average of the
log's closed ledgers, or its first waiting record's size when none is closed); no batch with
fewer than ``minRecordsPerTrigger`` records waiting until ``maxTriggerDelay`` has passed since
the last one (the query's first batch never waits, as Kafka's source). ``Trigger.AvailableNow``
reads what the logs held when the query started, in batches within the maximums, then stops:
the minimum does not hold a batch back there (the last records may be fewer, and waiting for
more would only delay the end).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from aiobk.client import BookKeeper, LogPosition
from aiobk.pipeline.options import Options
from aiobk.pipeline.positions import (
    BEFORE,
    LedgerRange,
    LogView,
    checked_start,
    resolve,
    select_logs,
    split_ranges,
    view,
)
from aiobk.pipeline.read import read_range

Offset = dict[str, Any]


def _encode(positions: dict[str, LogPosition]) -> Offset:
    return {
        "logs": {
            name: {"ledger": p.ledger_id, "entry": p.entry_id}
            for name, p in sorted(positions.items())
        }
    }


def decode_offset(offset: Offset, default_log: str) -> dict[str, LogPosition]:
    """The positions in ``offset`` (either shape, see the module docstring)."""
    if "logs" not in offset:
        return {default_log: LogPosition(int(offset["ledger"]), int(offset["entry"]))}
    return {
        name: LogPosition(int(p["ledger"]), int(p["entry"])) for name, p in offset["logs"].items()
    }


def _cut(ranges: Sequence[LedgerRange], records: int) -> LogPosition | None:
    """The exclusive end after the first ``records`` records of ``ranges`` (None: all)."""
    for r in ranges:
        if records < r.count:
            return LogPosition(r.ledger_id, r.first + records)
        records -= r.count
    return None


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._last_batch: float | None = None  # maxTriggerDelay counts from the last batch
        self._target: dict[str, LogPosition] | None = None  # Trigger.AvailableNow's end

    # ------------------------------------------------------------------ offsets

    def initialOffset(self) -> Offset:
        opts = self.opts

        async def initial(bk: BookKeeper) -> Offset:
            positions = {}
            for name in await select_logs(bk, opts):
                log_view = await view(bk, opts, name)
                bound = opts.start_positions.get(name, opts.start)
                start = await resolve(bk, opts, log_view, bound, opts.start_time)
                positions[name] = checked_start(log_view, start, opts.fail_on_data_loss)
            return _encode(positions)

        return opts.run(initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        opts = self.opts
        if opts.max_records is not None:
            return ReadMaxRows(opts.max_records)
        if opts.max_bytes is not None:
            return ReadMaxBytes(opts.max_bytes)
        if opts.min_records is not None:
            return ReadMinRows(opts.min_records)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        opts = self.opts

        async def now(bk: BookKeeper) -> dict[str, LogPosition]:
            names = await select_logs(bk, opts)
            return {name: (await view(bk, opts, name)).latest for name in names}

        self._target = opts.run(now)

    def latestOffset(self, start: Offset | None = None, limit: ReadLimit | None = None) -> Offset:
        opts = self.opts
        limited = limit is not None and not isinstance(limit, ReadAllAvailable)
        starts = decode_offset(start, opts.log) if start else {}

        async def latest(bk: BookKeeper) -> Offset:
            waiting: dict[str, tuple[LogPosition, LogPosition, LogView]] = {}
            names = await select_logs(bk, opts)
            if self._target is not None:
                names = [n for n in names if n in self._target]
            for name in names:
                begin = starts.get(name, BEFORE)
                log_view = await view(bk, opts, name, from_ledger=begin.ledger_id)
                begin = checked_start(log_view, begin, opts.fail_on_data_loss)
                end = log_view.latest
                if self._target is not None:
                    end = min(end, self._target[name])
                waiting[name] = (begin, max(begin, end), log_view)
            ends = {name: end for name, (_begin, end, _v) in waiting.items()}
            if limited:
                ends = await self._admit(bk, waiting)
            # A log that has records in the batch moves to its end (normalised past a finished
            # ledger); the others stay at their (checked) start.
            out = dict(starts)
            for name, end in ends.items():
                begin, _latest, log_view = waiting[name]
                out[name] = log_view.normalised(end) if end > begin else begin
            if any(end > waiting[name][0] for name, end in ends.items()):
                self._last_batch = time.monotonic()
            return _encode(out)

        return opts.run(latest)

    async def _admit(
        self, bk: BookKeeper, waiting: dict[str, tuple[LogPosition, LogPosition, LogView]]
    ) -> dict[str, LogPosition]:
        """The ends the options admit (see the module docstring)."""
        opts = self.opts
        ranges = {name: v.ranges(b, e) for name, (b, e, v) in waiting.items()}
        counts = {name: sum(r.count for r in rs) for name, rs in ranges.items()}
        total = sum(counts.values())
        begins = {name: b for name, (b, _e, _v) in waiting.items()}
        if total == 0:
            return begins
        few = opts.min_records is not None and total < opts.min_records
        waited = math.inf if self._last_batch is None else time.monotonic() - self._last_batch
        if few and self._target is None and waited < opts.max_trigger_delay:
            return begins
        share = 1.0
        if opts.max_records is not None:
            share = min(share, opts.max_records / total)
        if opts.max_bytes is not None:
            size = 0.0
            for name, rs in ranges.items():
                for r in rs:
                    size += r.count * await _record_size(bk, opts, waiting[name][2], r)
            share = min(share, opts.max_bytes / size if size else 1.0)
        ends = {name: end for name, (_b, end, _v) in waiting.items()}
        if share >= 1.0:
            return ends
        taken = {name: int(count * share) for name, count in counts.items()}
        if not any(taken.values()):  # at least one record a batch, from the first log waiting
            first = next(name for name, count in counts.items() if count)
            taken[first] = 1
        for name, count in taken.items():
            cut = _cut(ranges[name], count)
            if cut is not None:
                ends[name] = cut
        return ends

    def reportLatestOffset(self) -> Offset | None:
        return None

    # ------------------------------------------------------------------ batches

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        opts = self.opts
        begins = decode_offset(start, opts.log)
        ends = decode_offset(end, opts.log)

        async def plan(bk: BookKeeper) -> list[LedgerRange]:
            parts: list[LedgerRange] = []
            for name, stop in sorted(ends.items()):
                begin = begins.get(name, BEFORE)
                if begin >= stop:
                    continue
                log_view = await view(bk, opts, name, begin.ledger_id, stop.ledger_id)
                parts += log_view.ranges(begin, stop)
            return split_ranges(parts, opts.split, opts.min_partitions)

        return opts.run(plan)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LedgerRange)
        return read_range(self.opts, partition)

    def commit(self, end: Offset) -> None:
        return None


async def _record_size(bk: BookKeeper, opts: Options, log_view: LogView, r: LedgerRange) -> float:
    """The average record size of ``r``'s ledger: from its length once closed, else from the
    log's closed ledgers, else from the size of its first record in the range."""
    length = log_view.lengths.get(r.ledger_id)
    if length is not None and log_view.ends.get(r.ledger_id, -1) >= 0:
        return length / (log_view.ends[r.ledger_id] + 1)
    closed = [
        (size, log_view.ends[i] + 1)
        for i, size in log_view.lengths.items()
        if log_view.ends.get(i, -1) >= 0
    ]
    if closed:
        return sum(size for size, _n in closed) / sum(n for _s, n in closed)
    handle = await bk.open_ledger(r.ledger_id, opts.password, recovery=False)
    try:
        (entry,) = await handle.read_unconfirmed(r.first, r.first)
    finally:
        await handle.close()
    return float(len(entry.data))


__all__ = ["StreamReader", "decode_offset"]
