"""Which logs a query reads, where in each it starts and ends, and the ranges in between.

A position here is the next record to read, ``LogPosition(ledger, entry)``; an end is
exclusive (the first record not read), as Spark's Kafka source has it. ``LogPosition(-1, 0)``
is before every record of a log (``BEFORE``). Every bound resolves against a ``LogView``: the
log's ledgers and each one's readable end when the plan was made (closed: its last entry;
open: its LAC, never fenced), so a plan reads exactly what was acknowledged when it was made.

Data loss: a start inside ledgers the log no longer holds (truncated away) is refused with
``DataLossError`` while ``failOnDataLoss`` is true (the default); otherwise the query moves to
the earliest record left and logs what it skipped. A start at the end of a closed ledger is
normalised to the start of the next ledger, so consuming a ledger to its end and then seeing
it truncated is not mistaken for a loss.

A ledger with a complete copy in the object store (offloaded: copied or released) becomes a
range carrying its ``OffloadRef``: the task reads the object itself, with no etcd and no bookie
on the path, which is both the only way to read a released ledger and the faster way to read a
copied one (bench/offload.py measures both paths).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyspark.sql.datasource import InputPartition

from aiobk.client import BookKeeper, LogPosition
from aiobk.client.log.by_time import position_at_time
from aiobk.client.log.format import ENVELOPE
from aiobk.client.offload import offload_ref
from aiobk.pipeline.options import EARLIEST, LATEST, Bound, Options
from aiobk.protocol.errors import NoSuchLedgerError, NoSuchLogError
from aiobk.tiered.objects import OffloadRef

log = logging.getLogger(__name__)

BEFORE = LogPosition(-1, 0)


class DataLossError(RuntimeError):
    """A query's start lies in ledgers the log no longer holds."""


class LedgerRange(InputPartition):
    """Entries first..last (inclusive) of one ledger of one log: one read task. ``offload``:
    the object holding the ledger, read instead of its bookies when set."""

    def __init__(
        self,
        log_name: str | None,
        ledger_id: int,
        first: int,
        last: int,
        record_format: str,
        offload: OffloadRef | None = None,
    ) -> None:
        super().__init__((log_name, ledger_id, first, last))
        self.log = log_name
        self.ledger_id = ledger_id
        self.first = first
        self.last = last
        self.record_format = record_format
        self.offload = offload

    @property
    def count(self) -> int:
        return max(0, self.last - self.first + 1)

    def __repr__(self) -> str:
        where = ", object" if self.offload is not None else ""
        return f"LedgerRange({self.log}, {self.ledger_id}, {self.first}..{self.last}{where})"


@dataclass
class LogView:
    """A log as one plan sees it."""

    name: str
    ledgers: tuple[int, ...]
    record_format: str
    ends: dict[int, int]  # ledger -> its last readable entry (-1: empty); gone ones absent
    lengths: dict[int, int]  # closed ledger -> its payload bytes (for byte limits)
    refs: dict[int, OffloadRef] = field(default_factory=dict)  # offloaded ledger -> its object

    @property
    def latest(self) -> LogPosition:
        """The end of the log now (exclusive)."""
        for ledger_id in reversed(self.ledgers):
            if ledger_id in self.ends:
                return LogPosition(ledger_id, self.ends[ledger_id] + 1)
        return BEFORE

    def normalised(self, position: LogPosition) -> LogPosition:
        """``position``, moved from the end of a finished ledger to the next ledger's start."""
        later = [i for i in self.ledgers if i > position.ledger_id]
        end = self.ends.get(position.ledger_id)
        if later and end is not None and position.entry_id > end:
            return LogPosition(later[0], 0)
        return position

    def ranges(self, start: LogPosition, end: LogPosition) -> list[LedgerRange]:
        """The records from ``start`` (inclusive) to ``end`` (exclusive), a range per ledger."""
        out: list[LedgerRange] = []
        for ledger_id in self.ledgers:
            if ledger_id < start.ledger_id or ledger_id > end.ledger_id:
                continue
            if ledger_id not in self.ends:
                continue
            first = start.entry_id if ledger_id == start.ledger_id else 0
            last = self.ends[ledger_id]
            if ledger_id == end.ledger_id:
                last = min(last, end.entry_id - 1)
            if last >= first:
                out.append(
                    LedgerRange(
                        self.name,
                        ledger_id,
                        first,
                        last,
                        self.record_format,
                        self.refs.get(ledger_id),
                    )
                )
        return out


async def select_logs(bk: BookKeeper, opts: Options) -> list[str]:
    """The logs a query reads: those named, or those whose names match ``logPattern`` now."""
    if opts.logs:
        return list(opts.logs)
    pattern = re.compile(opts.pattern)
    return sorted([name async for name in bk.list_logs() if pattern.fullmatch(name)])


async def view(
    bk: BookKeeper, opts: Options, name: str, from_ledger: int = -1, to_ledger: int | None = None
) -> LogView:
    """Log ``name`` now, with the readable ends of its ledgers in [from_ledger, to_ledger]."""
    try:
        record = await bk.store.read_log(name)
    except NoSuchLogError:
        raise NoSuchLogError(f"the aiobk data source: log {name!r} does not exist") from None
    ends: dict[int, int] = {}
    lengths: dict[int, int] = {}
    refs: dict[int, OffloadRef] = {}
    for ledger_id in record.ledgers:
        if ledger_id < from_ledger or (to_ledger is not None and ledger_id > to_ledger):
            continue
        try:
            handle = await bk.open_ledger(ledger_id, opts.password, recovery=False)
        except NoSuchLedgerError:
            continue  # truncated away meanwhile
        ends[ledger_id] = handle.last_add_confirmed
        if handle.is_closed:
            lengths[ledger_id] = handle.metadata.length
        ref = offload_ref(ledger_id, handle.metadata)
        if ref is not None:
            refs[ledger_id] = ref
        await handle.close()
    return LogView(name, record.ledgers, record.record_format, ends, lengths, refs)


async def resolve(
    bk: BookKeeper,
    opts: Options,
    log_view: LogView,
    bound: Bound,
    timestamp: int | None,
) -> LogPosition:
    """A bound of ``log_view``: earliest, latest, a position or the first record at or after
    ``timestamp`` (latest when every record is older)."""
    if timestamp is not None:
        if log_view.record_format != ENVELOPE:
            raise ValueError(
                f"log {log_view.name!r} holds {log_view.record_format} records, which carry no "
                "timestamp: startingTimestamp and endingTimestamp need envelope records"
            )
        found = await position_at_time(bk, log_view.name, timestamp, opts.password)
        return log_view.latest if found is None else found
    if bound == EARLIEST:
        return BEFORE
    if bound == LATEST:
        return log_view.latest
    assert isinstance(bound, LogPosition)
    return bound


def checked_start(log_view: LogView, start: LogPosition, fail_on_data_loss: bool) -> LogPosition:
    """``start``, unless the log lost records at or after it to truncation (see the module
    docstring): then DataLossError, or the earliest record left."""
    start = log_view.normalised(start)
    if start.ledger_id < 0 or start.ledger_id in log_view.ends:
        return start
    remaining = [i for i in log_view.ledgers if i in log_view.ends]
    if remaining and start.ledger_id > remaining[0]:
        return start  # between ledgers: nothing there to lose
    if not remaining and start.ledger_id > max(log_view.ledgers, default=-1):
        return start
    earliest = LogPosition(remaining[0], 0) if remaining else log_view.latest
    message = (
        f"log {log_view.name!r}: the records from {start} up to {earliest} were truncated away "
        "before they were read"
    )
    if fail_on_data_loss:
        raise DataLossError(
            f"{message}; set .option('failOnDataLoss', 'false') to skip to the earliest record left"
        )
    log.warning("%s; skipping to %s (failOnDataLoss is false)", message, earliest)
    return earliest


def split_ranges(
    ranges: Sequence[LedgerRange], split: int, min_partitions: int | None
) -> list[LedgerRange]:
    """Ranges of at most ``split`` records each, and at least ``min_partitions`` ranges when
    there are that many records (large ledgers are cut; ranges are never merged)."""
    total = sum(r.count for r in ranges)
    size = split
    if min_partitions and total:
        size = max(1, min(split, -(-total // min_partitions)))
    out: list[LedgerRange] = []
    for r in ranges:
        for lo in range(r.first, r.last + 1, size):
            hi = min(r.last, lo + size - 1)
            out.append(LedgerRange(r.log, r.ledger_id, lo, hi, r.record_format, r.offload))
    return out


__all__ = [
    "BEFORE",
    "DataLossError",
    "LedgerRange",
    "LogView",
    "checked_start",
    "resolve",
    "select_logs",
    "split_ranges",
    "view",
]
