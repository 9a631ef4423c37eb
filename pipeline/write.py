"""Batch appends to logs.

Columns: ``data`` (binary or string, required), and optionally ``key`` (binary or string),
``headers`` (a map of string to binary or string), ``timestamp`` (a timestamp, or a long of
milliseconds since the epoch) and ``log`` (the log each row goes to; rows without one go to
``.option('log', NAME)``). Other columns are ignored.

Each task writes its partition's rows into a ledger of its own per log and closes them; the
job's commit then appends those ledgers to each log as its writer would
(``aiobk.client.log.append``: fence the log's last two ledgers, one compare-and-set), in
ascending ledger id order -- the order positions in a log follow.

Delivery: each log's part of a job is published all or nothing (one compare-and-set), exactly
once for a job that commits. Across logs a commit is not atomic: the logs are published one by
one in name order, and a failure in the middle (etcd down, another writer that took a log)
leaves the logs before it published and the rest unchanged; the commit then raises, naming
them. A failed or aborted job leaves every log unchanged and deletes its ledgers.

Formats: a log that exists keeps its own format (a key, headers or a timestamp for a log of
raw records is refused); a log the job creates gets ``.option('recordFormat', ...)``, or, when
not given, ``envelope`` if the DataFrame has a ``key``, ``headers`` or ``timestamp`` column and
``raw`` otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from aiobk.client import BookKeeper, LedgerHandle
from aiobk.client.log.append import append_ledgers_to_log
from aiobk.client.log.format import ENVELOPE, RAW, check_format, encode
from aiobk.pipeline.options import Options
from aiobk.protocol.errors import NoSuchLedgerError, NoSuchLogError

WINDOW = 1024  # appends a task keeps in flight
RECORD_COLUMNS = ("key", "headers", "timestamp")


@dataclass
class Written(WriterCommitMessage):
    """A ledger a task wrote (``log``: the log it goes to; empty: the ``log`` option's)."""

    partition: int
    ledger_id: int
    count: int
    log: str = ""
    record_format: str = RAW


@dataclass
class TaskWritten(WriterCommitMessage):
    """Everything one task wrote: a ledger per log it had rows for."""

    partition: int
    written: list[Written] = field(default_factory=list)


def _flatten(messages: Sequence[WriterCommitMessage | None]) -> list[Written]:
    out: list[Written] = []
    for m in messages:
        if isinstance(m, Written):
            out.append(m)
        elif isinstance(m, TaskWritten):
            out += m.written
    return out


def publish_plan(
    messages: Sequence[WriterCommitMessage | None], default_log: str
) -> dict[str, tuple[str, list[int]]]:
    """log -> (record format, its ledgers in ascending order), for the ledgers with rows."""
    plan: dict[str, tuple[str, list[int]]] = {}
    for w in _flatten(messages):
        if w.count:
            name = w.log or default_log
            plan.setdefault(name, (w.record_format, []))[1].append(w.ledger_id)
    return {name: (fmt, sorted(ids)) for name, (fmt, ids) in sorted(plan.items())}


def _bytes(value: Any, column: str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise ValueError(f"column {column!r} must be binary or string, not {type(value).__name__}")


def _stamps(column: Any) -> list[int | None]:
    """A ``timestamp`` column as ms since the epoch: a Spark timestamp (Arrow: microseconds)
    or a long of ms."""
    if pa.types.is_timestamp(column.type):
        micros = column.cast(pa.int64()).to_pylist()
        return [None if m is None else m // 1000 for m in micros]
    if pa.types.is_integer(column.type):
        return list(column.to_pylist())
    raise ValueError(f"column 'timestamp' must be a timestamp or a long (ms), not {column.type}")


class _Task:
    """One task's ledgers, a ledger per log as rows for it come."""

    def __init__(self, writer: Writer, bk: BookKeeper, partition: int) -> None:
        self.writer = writer
        self.bk = bk
        self.partition = partition
        self.handles: dict[str, LedgerHandle] = {}
        self.formats: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.pending: collections.deque[asyncio.Future[int]] = collections.deque()

    async def ledger(self, name: str) -> tuple[LedgerHandle, str]:
        handle = self.handles.get(name)
        if handle is None:
            opts = self.writer.opts
            try:
                fmt = check_format((await self.bk.store.read_log(name)).record_format)
            except NoSuchLogError:
                fmt = self.writer.new_log_format
            handle = await self.bk.create_ledger(
                password=opts.password,
                custom_metadata={
                    "log": name.encode(),
                    "spark": b"pending",
                    "spark_job": self.writer.job.encode(),
                },
            )
            self.handles[name], self.formats[name], self.counts[name] = handle, fmt, 0
        return handle, self.formats[name]

    async def add(
        self,
        log: str | None,
        data: Any,
        key: Any = None,
        headers: Any = None,
        stamp: int | None = None,
    ) -> None:
        """Append one row (``stamp`` in ms, None: now) to its log's ledger."""
        name = log or self.writer.opts.log
        if not name:
            raise ValueError("a row has no log: give .option('log', NAME) or a 'log' value")
        handle, fmt = await self.ledger(name)
        payload = _bytes(data, "data")
        if fmt == ENVELOPE:
            payload = encode(
                payload,
                stamp if stamp is not None else self.writer.clock_ms(),
                None if key is None else _bytes(key, "key"),
                None if not headers else _headers(headers),
            )
        elif key is not None or headers or stamp is not None:
            raise ValueError(
                f"log {name!r} holds raw records: a row with a key, headers or a timestamp "
                "needs a log of envelope records"
            )
        await self.submit(handle, payload)
        self.counts[name] += 1

    async def submit(self, handle: LedgerHandle, payload: bytes) -> None:
        """A sliding window of adds in flight: past WINDOW, wait for the oldest (adds complete
        in order), so the pipeline never drains and a failed add fails the task at once.
        (Waiting for a whole thousand at a time drained it each time; an unbounded window kept
        tens of thousands of futures to look through.)"""
        if len(self.pending) >= WINDOW:
            await self.pending.popleft()
        _entry, done = await handle.submit(payload)
        self.pending.append(done)

    async def write_batch(self, batch: Any) -> None:
        """The rows of one Arrow batch (columns as the module docstring lists them)."""
        names = batch.schema.names
        count = batch.num_rows
        data = batch.column(names.index("data")).to_pylist()
        if not any(c in names for c in ("log", *RECORD_COLUMNS)):
            # Only data, for the one log: no per-row routing or envelope fields to look at.
            handle, fmt = await self.ledger(self.writer.opts.log)
            if fmt == RAW:
                for value in data:
                    await self.submit(
                        handle, value if type(value) is bytes else _bytes(value, "data")
                    )
                self.counts[self.writer.opts.log] += count
                return
        none: list[Any] = [None] * count
        logs = batch.column(names.index("log")).to_pylist() if "log" in names else none
        keys = batch.column(names.index("key")).to_pylist() if "key" in names else none
        heads = batch.column(names.index("headers")).to_pylist() if "headers" in names else none
        stamps = _stamps(batch.column(names.index("timestamp"))) if "timestamp" in names else none
        for i in range(count):
            await self.add(logs[i], data[i], keys[i], heads[i], stamps[i])

    async def finish(self) -> TaskWritten:
        await asyncio.gather(*self.pending)
        for handle in self.handles.values():
            await handle.close()
        return TaskWritten(
            self.partition,
            [
                Written(self.partition, h.ledger_id, self.counts[n], n, self.formats[n])
                for n, h in self.handles.items()
            ],
        )

    async def discard(self) -> None:
        for handle in self.handles.values():
            with contextlib.suppress(Exception):
                await self.bk.delete_ledger(handle.ledger_id, self.writer.opts.password)


def _headers(headers: Mapping[str, Any] | list[tuple[str, Any]]) -> dict[str, bytes]:
    pairs = headers.items() if isinstance(headers, Mapping) else headers  # Arrow: (key, value)s
    return {str(k): _bytes(v, "headers") for k, v in pairs}


class Writer(DataSourceArrowWriter):
    """One per job, made on the driver and shipped to the tasks. Every ledger a task creates
    carries the job's token; ``commit`` and ``abort`` delete the job's ledgers that are not
    published, including those of task attempts that were killed before they could clean up."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.fields = tuple(schema.fieldNames())
        if "data" not in self.fields:
            raise ValueError("writing to aiobk needs a 'data' column (binary or string)")
        if not opts.log and "log" not in self.fields:
            raise ValueError("writing to aiobk needs .option('log', NAME) or a 'log' column")
        self.new_log_format = opts.record_format or ENVELOPE
        self.job = os.urandom(8).hex()
        self.first_id = opts.run(_allocate_id)  # the job's ledgers all come after it

    @staticmethod
    def clock_ms() -> int:
        """A record's default time: the task's clock when it is written, in ms."""
        return round(datetime.datetime.now(datetime.UTC).timestamp() * 1000)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0

        async def store(bk: BookKeeper) -> TaskWritten:
            task = _Task(self, bk, partition)
            try:
                for batch in iterator:
                    await task.write_batch(batch)
                return await task.finish()
            except BaseException:
                # A failed attempt (its rows, the bookies or a retry of the task) leaves no
                # ledger behind; the job's commit publishes successful attempts only.
                await task.discard()
                raise

        return self.opts.run(store)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        plan = publish_plan(messages, self.opts.log)
        opts = self.opts

        async def publish(bk: BookKeeper) -> None:
            published: set[int] = set()
            try:
                for name, (fmt, ids) in plan.items():
                    await append_ledgers_to_log(bk, name, ids, opts.password, record_format=fmt)
                    published.update(ids)
            except Exception as exc:
                done = sorted({n for n, (_f, ids) in plan.items() if published.issuperset(ids)})
                raise RuntimeError(
                    f"aiobk write: published to {done or 'no log'}, then failed: {exc}"
                ) from exc
            finally:
                await _sweep(bk, self.job, self.first_id, keep=published)

        opts.run(publish)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.opts.run(lambda bk: _sweep(bk, self.job, self.first_id, keep=set()))


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


__all__ = ["TaskWritten", "Writer", "Written", "publish_plan"]
