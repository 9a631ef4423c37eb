"""Batch and streaming reads of a log (or of given ledgers).

Reading never fences or recovers anything: an open ledger is read up to its LAC, so a batch
read or a micro-batch sees exactly what was acknowledged when it was planned.

Streaming offsets are log positions ``{"ledger": L, "entry": E}`` -- the next record to read.
A micro-batch covers exactly the records between two offsets, so replaying it after a restart
from the checkpoint reads the same records again: with an idempotent or transactional sink,
exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from aiobk.client import BookKeeper
from aiobk.pipeline.options import Options
from aiobk.protocol.errors import NoSuchLedgerError

READ_BATCH = 1000  # entries per read request of a task


class LedgerRange(InputPartition):
    """Entries first..last (inclusive) of one ledger: one read task."""

    def __init__(self, ledger_id: int, first: int, last: int) -> None:
        super().__init__((ledger_id, first, last))
        self.ledger_id = ledger_id
        self.first = first
        self.last = last

    def __repr__(self) -> str:
        return f"LedgerRange({self.ledger_id}, {self.first}..{self.last})"


async def readable_ends(bk: BookKeeper, opts: Options, ledger_ids: Sequence[int]) -> dict[int, int]:
    """Each ledger's readable end: its last entry if closed, else its LAC (never fenced);
    ledgers truncated away are left out."""
    ends: dict[int, int] = {}
    for ledger_id in ledger_ids:
        try:
            handle = await bk.open_ledger(ledger_id, opts.password, recovery=False)
        except NoSuchLedgerError:
            continue
        ends[ledger_id] = handle.last_add_confirmed
    return ends


async def log_ledgers(bk: BookKeeper, opts: Options) -> tuple[int, ...]:
    return (await bk.store.read_log(opts.log)).ledgers


def split_range(ledger_id: int, first: int, last: int, size: int) -> list[LedgerRange]:
    return [
        LedgerRange(ledger_id, lo, min(last, lo + size - 1)) for lo in range(first, last + 1, size)
    ]


def read_range(opts: Options, part: LedgerRange) -> Iterator[tuple[Any, ...]]:
    """One task: the rows of ``part``."""

    async def fetch(bk: BookKeeper) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        name = opts.log or None
        handle = await bk.open_ledger(part.ledger_id, opts.password, recovery=False)
        for lo in range(part.first, part.last + 1, READ_BATCH):
            entries = await handle.read_unconfirmed(lo, min(part.last, lo + READ_BATCH - 1))
            rows.extend((name, part.ledger_id, e.entry_id, bytes(e.data)) for e in entries)
        return rows

    if part.last >= part.first:
        yield from opts.run(fetch)


class BatchReader(DataSourceReader):
    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts

        async def plan(bk: BookKeeper) -> list[LedgerRange]:
            ledger_ids = opts.ledgers or await log_ledgers(bk, opts)
            ends = await readable_ends(bk, opts, ledger_ids)
            parts: list[LedgerRange] = []
            for ledger_id in ledger_ids:
                if ledger_id in ends:
                    parts += split_range(ledger_id, 0, ends[ledger_id], opts.split)
            return parts

        return opts.run(plan) or [LedgerRange(-1, 0, -1)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, LedgerRange)
        return read_range(self.opts, partition)


def _offset(ledger_id: int, entry_id: int) -> dict[str, int]:
    return {"ledger": ledger_id, "entry": entry_id}


class StreamReader(DataSourceStreamReader):
    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def initialOffset(self) -> dict[str, int]:
        if self.opts.start == "latest":
            return self._latest()
        return _offset(-1, 0)

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: object = None
    ) -> dict[str, int]:
        return self._latest()

    def _latest(self) -> dict[str, int]:
        opts = self.opts

        async def latest(bk: BookKeeper) -> dict[str, int]:
            ledgers = await log_ledgers(bk, opts)
            if not ledgers:
                return _offset(-1, 0)
            last = ledgers[-1]
            end = (await readable_ends(bk, opts, [last])).get(last, -1)
            return _offset(last, end + 1)

        return opts.run(latest)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        opts = self.opts
        lo = (start["ledger"], start["entry"])
        hi = (end["ledger"], end["entry"])
        if lo >= hi:
            return []

        async def plan(bk: BookKeeper) -> list[LedgerRange]:
            ledgers = [lid for lid in await log_ledgers(bk, opts) if lo[0] <= lid <= hi[0]]
            inner = [lid for lid in ledgers if lid != hi[0]]
            ends = await readable_ends(bk, opts, inner)  # earlier ledgers are closed
            parts: list[LedgerRange] = []
            for ledger_id in ledgers:
                first = lo[1] if ledger_id == lo[0] else 0
                last = hi[1] - 1 if ledger_id == hi[0] else ends.get(ledger_id, -1)
                if last >= first:
                    parts += split_range(ledger_id, first, last, opts.split)
            return parts

        return opts.run(plan)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, LedgerRange)
        return read_range(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        return None


__all__ = ["BatchReader", "LedgerRange", "StreamReader"]
