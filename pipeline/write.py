"""Batch appends to a log.

Each task writes its partition's rows (column ``data``, binary or string) into a ledger of its
own and closes it; the job's commit then appends those ledgers to the log as its writer would
(``aiobk.client.log_append``: fence the log's last two ledgers, one compare-and-set), in
ascending ledger id order -- the order positions in a log follow. A failed or aborted job
leaves the log unchanged and deletes its ledgers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from aiobk.client import BookKeeper, LedgerHandle
from aiobk.client.log_append import append_ledgers_to_log
from aiobk.pipeline.options import Options
from aiobk.protocol.errors import NoSuchLedgerError

PENDING_PER_TASK = 1000  # appends a task has in flight


@dataclass
class Written(WriterCommitMessage):
    partition: int
    ledger_id: int
    count: int


def publish_order(messages: Sequence[WriterCommitMessage | None]) -> list[int]:
    """The ledgers a commit appends: those of the tasks that wrote rows, in ascending id order
    (a log's positions follow ledger order; tasks create their ledgers in any order)."""
    return sorted(m.ledger_id for m in messages if isinstance(m, Written) and m.count)


class Writer(DataSourceWriter):
    """One per job, made on the driver and shipped to the tasks. Every ledger a task creates
    carries the job's token; ``commit`` and ``abort`` delete the job's ledgers that are not
    published, including those of task attempts that were killed before they could clean up."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        if "data" not in schema.fieldNames():
            raise ValueError("writing to aiobk needs a 'data' column (binary or string)")
        self.job = os.urandom(8).hex()
        self.first_id = opts.run(_allocate_id)  # the job's ledgers all come after it

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        opts = self.opts

        async def store(bk: BookKeeper) -> Written:
            lh = await bk.create_ledger(
                password=opts.password,
                custom_metadata={
                    "log": opts.log.encode(),
                    "spark": b"pending",
                    "spark_job": self.job.encode(),
                },
            )
            try:
                count = await _write_rows(lh, iterator)
                await lh.close()
            except BaseException:
                # A failed attempt (its rows, the bookies or a retry of the task) leaves no
                # ledger behind; the job's commit publishes successful attempts only.
                with contextlib.suppress(Exception):
                    await bk.delete_ledger(lh.ledger_id, opts.password)
                raise
            return Written(partition, lh.ledger_id, count)

        return opts.run(store)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        published = publish_order(messages)
        opts = self.opts

        async def publish(bk: BookKeeper) -> None:
            if published:
                await append_ledgers_to_log(bk, opts.log, published, opts.password)
            await _sweep(bk, self.job, self.first_id, keep=set(published))

        opts.run(publish)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.opts.run(lambda bk: _sweep(bk, self.job, self.first_id, keep=set()))


async def _write_rows(lh: LedgerHandle, rows: Iterator[Any]) -> int:
    pending: list[asyncio.Future[int]] = []
    count = 0
    for row in rows:
        value = row["data"]
        data = value.encode() if isinstance(value, str) else bytes(value)
        _entry, done = await lh.submit(data)
        pending.append(done)
        count += 1
        if len(pending) >= PENDING_PER_TASK:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return count


async def _allocate_id(bk: BookKeeper) -> int:
    return await bk.store.allocate_ledger_id()


async def _sweep(bk: BookKeeper, job: str, first_id: int, keep: set[int]) -> None:
    """Delete the job's ledgers (ids after ``first_id``, tagged with ``job``) not in ``keep``:
    empty ones, and those of failed, killed or superseded task attempts."""
    token = job.encode()
    async for ledger_id in bk.list_ledgers():
        if ledger_id <= first_id or ledger_id in keep:
            continue
        try:
            metadata = await bk.store.read_ledger(ledger_id)
            if metadata.custom_metadata.get("spark_job") == token:
                await bk.delete_ledger(ledger_id, force=True)  # the job's own, by its token
        except NoSuchLedgerError:
            continue


__all__ = ["Writer", "Written", "publish_order"]
