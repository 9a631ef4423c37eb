"""The ``aiobk`` PySpark data source (Spark 4 ``pyspark.sql.datasource``): batch and streaming
reads of a log, batch appends to it.

Options: ``metadata`` (the metadata URI, required), ``log`` (a log name) or ``ledgers``
(comma-separated ledger ids, batch read only), ``password`` (default empty), ``split`` (most
entries per read partition, default 100000: a big ledger is read by several tasks),
``startingPosition`` (streaming: ``earliest``, default, or ``latest``).

Reading never fences or recovers anything: an open ledger is read up to its LAC, so a batch
read or a micro-batch sees exactly what was acknowledged when it was planned.

Streaming offsets are log positions ``{"ledger": L, "entry": E}`` -- the next record to read.
A micro-batch covers exactly the records between two offsets, so replaying it after a restart
from the checkpoint reads the same records again: with an idempotent or transactional sink,
exactly once.

Writing: each task writes its partition's rows (column ``data``, binary or string) into a
ledger of its own and closes it; the job's commit then takes the log as a writer would (fences
its last two ledgers) and appends those ledgers to it in one compare-and-set, in partition
order. A failed or aborted job leaves the log unchanged and deletes its ledgers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from aiobk.client import LedgerHandle

SCHEMA = "log string, ledger_id long, entry_id long, data binary"
DEFAULT_SPLIT = 100_000

T = TypeVar("T")


def _run(coro: Awaitable[T]) -> T:
    """Run client code from Spark's synchronous callbacks (driver or executor)."""

    async def main() -> T:
        return await coro

    return asyncio.run(main())


@dataclass(frozen=True)
class _Options:
    metadata: str
    log: str
    ledgers: tuple[int, ...]
    password: bytes
    split: int
    start: str

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        metadata = options.get("metadata", "")
        if not metadata:
            raise ValueError("the aiobk data source needs .option('metadata', 'etcd://...')")
        log = options.get("log", "")
        ledgers = tuple(int(x) for x in options.get("ledgers", "").split(",") if x.strip())
        if not log and not ledgers:
            raise ValueError("the aiobk data source needs .option('log', NAME) or 'ledgers'")
        split = int(options.get("split", DEFAULT_SPLIT))
        if split < 1:
            raise ValueError("option 'split' must be positive")
        start = options.get("startingPosition", "earliest").lower()
        if start not in ("earliest", "latest"):
            raise ValueError("option 'startingPosition' must be 'earliest' or 'latest'")
        return cls(metadata, log, ledgers, options.get("password", "").encode(), split, start)


class LedgerRange(InputPartition):
    """Entries first..last (inclusive) of one ledger: one read task."""

    def __init__(self, ledger_id: int, first: int, last: int) -> None:
        super().__init__((ledger_id, first, last))
        self.ledger_id = ledger_id
        self.first = first
        self.last = last

    def __repr__(self) -> str:
        return f"LedgerRange({self.ledger_id}, {self.first}..{self.last})"


async def _ends(opts: _Options, ledger_ids: Sequence[int]) -> dict[int, int]:
    """Each ledger's readable end: its last entry if closed, else its LAC (never fenced)."""
    from aiobk.client import BookKeeper  # noqa: PLC0415 - imported where Spark runs the code
    from aiobk.client.errors import NoSuchLedgerError  # noqa: PLC0415

    ends: dict[int, int] = {}
    async with await BookKeeper.connect(opts.metadata) as bk:
        for ledger_id in ledger_ids:
            try:
                handle = await bk.open_ledger(ledger_id, opts.password, recovery=False)
            except NoSuchLedgerError:
                continue  # truncated away
            ends[ledger_id] = handle.last_add_confirmed
    return ends


async def _log_ledgers(opts: _Options) -> tuple[int, ...]:
    from aiobk.client import BookKeeper  # noqa: PLC0415

    async with await BookKeeper.connect(opts.metadata) as bk:
        return (await bk.store.read_log(opts.log)).ledgers


def _split(ledger_id: int, first: int, last: int, size: int) -> list[LedgerRange]:
    return [
        LedgerRange(ledger_id, lo, min(last, lo + size - 1)) for lo in range(first, last + 1, size)
    ]


def _read_range(opts: _Options, part: LedgerRange) -> Iterator[tuple[Any, ...]]:
    async def fetch() -> list[tuple[Any, ...]]:
        from aiobk.client import BookKeeper  # noqa: PLC0415

        rows: list[tuple[Any, ...]] = []
        name = opts.log or None
        async with await BookKeeper.connect(opts.metadata) as bk:
            handle = await bk.open_ledger(part.ledger_id, opts.password, recovery=False)
            step = 1000
            for lo in range(part.first, part.last + 1, step):
                entries = await handle.read_unconfirmed(lo, min(part.last, lo + step - 1))
                rows.extend((name, part.ledger_id, e.entry_id, bytes(e.data)) for e in entries)
        return rows

    if part.last >= part.first:
        yield from _run(fetch())


class AiobkDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "aiobk"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(_Options.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = _Options.parse(self.options)
        if not opts.log:
            raise ValueError("streaming reads need .option('log', NAME)")
        return _StreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = _Options.parse(self.options)
        if overwrite:
            raise ValueError("the aiobk data source only appends: use mode('append')")
        if not opts.log:
            raise ValueError("writes need .option('log', NAME)")
        return _Writer(opts, schema)


class _BatchReader(DataSourceReader):
    def __init__(self, opts: _Options) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        ledger_ids = opts.ledgers or _run(_log_ledgers(opts))
        ends = _run(_ends(opts, ledger_ids))
        parts: list[LedgerRange] = []
        for ledger_id in ledger_ids:
            if ledger_id in ends:
                parts += _split(ledger_id, 0, ends[ledger_id], opts.split)
        return parts or [LedgerRange(-1, 0, -1)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, LedgerRange)
        return _read_range(self.opts, partition)


def _offset(ledger_id: int, entry_id: int) -> dict[str, int]:
    return {"ledger": ledger_id, "entry": entry_id}


class _StreamReader(DataSourceStreamReader):
    def __init__(self, opts: _Options) -> None:
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
        ledgers = _run(_log_ledgers(self.opts))
        if not ledgers:
            return _offset(-1, 0)
        last = ledgers[-1]
        end = _run(_ends(self.opts, [last])).get(last, -1)
        return _offset(last, end + 1)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        opts = self.opts
        lo = (start["ledger"], start["entry"])
        hi = (end["ledger"], end["entry"])
        if lo >= hi:
            return []
        ledgers = [lid for lid in _run(_log_ledgers(opts)) if lo[0] <= lid <= hi[0]]
        inner = [lid for lid in ledgers if lid != hi[0]]
        ends = _run(_ends(opts, inner))  # earlier ledgers are closed: their last entry
        parts: list[LedgerRange] = []
        for ledger_id in ledgers:
            first = lo[1] if ledger_id == lo[0] else 0
            last = hi[1] - 1 if ledger_id == hi[0] else ends.get(ledger_id, -1)
            if last >= first:
                parts += _split(ledger_id, first, last, opts.split)
        return parts

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, LedgerRange)
        return _read_range(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        return None


@dataclass
class _Written(WriterCommitMessage):
    partition: int
    ledger_id: int
    count: int


class _Writer(DataSourceWriter):
    """One per job, made on the driver and shipped to the tasks. Every ledger a task creates
    carries the job's token; ``commit`` and ``abort`` delete the job's ledgers that are not
    published, including those of task attempts that were killed before they could clean up."""

    def __init__(self, opts: _Options, schema: StructType) -> None:
        self.opts = opts
        if "data" not in schema.fieldNames():
            raise ValueError("writing to aiobk needs a 'data' column (binary or string)")
        self.job = os.urandom(8).hex()
        self.first_id = _run(_allocate_id(opts))  # the job's ledgers all come after it

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext  # noqa: PLC0415

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0

        async def store() -> _Written:
            from aiobk.client import BookKeeper  # noqa: PLC0415

            async with await BookKeeper.connect(self.opts.metadata) as bk:
                lh = await bk.create_ledger(
                    password=self.opts.password,
                    custom_metadata={
                        "log": self.opts.log.encode(),
                        "spark": b"pending",
                        "spark_job": self.job.encode(),
                    },
                )
                try:
                    count = await _write_rows(lh, iterator)
                    await lh.close()
                except BaseException:
                    # A failed attempt (its rows, the bookies or a retry of the task) leaves
                    # no ledger behind; the job's commit publishes successful attempts only.
                    with contextlib.suppress(Exception):
                        await bk.delete_ledger(lh.ledger_id)
                    raise
                return _Written(partition, lh.ledger_id, count)

        return _run(store())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        written = sorted(
            (m for m in messages if isinstance(m, _Written)), key=lambda m: m.partition
        )
        published = [m.ledger_id for m in written if m.count]
        _run(_publish(self.opts, published))
        _run(_sweep(self.opts, self.job, self.first_id, keep=set(published)))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _run(_sweep(self.opts, self.job, self.first_id, keep=set()))


async def _write_rows(lh: LedgerHandle, rows: Iterator[Any]) -> int:
    pending: list[asyncio.Future[int]] = []
    count = 0
    for row in rows:
        value = row["data"]
        data = value.encode() if isinstance(value, str) else bytes(value)
        _entry, done = await lh.submit(data)
        pending.append(done)
        count += 1
        if len(pending) >= 1000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return count


async def _publish(opts: _Options, ledger_ids: list[int]) -> None:
    """Append the job's ledgers to the log as its writer: fence, then one CAS."""
    from aiobk.client import BookKeeper  # noqa: PLC0415
    from aiobk.client.errors import (  # noqa: PLC0415
        LogExistsError,
        LogFencedError,
        MetadataVersionError,
        NoSuchLedgerError,
        NoSuchLogError,
    )

    if not ledger_ids:
        return
    async with await BookKeeper.connect(opts.metadata) as bk:
        store = bk.store
        for _attempt in range(bk.config.metadata_retries):
            try:
                record = await store.read_log(opts.log)
            except NoSuchLogError:
                with contextlib.suppress(LogExistsError):
                    await store.create_log(opts.log)
                continue
            for ledger_id in record.ledgers[-2:]:
                with contextlib.suppress(NoSuchLedgerError):
                    await bk.open_ledger(ledger_id, opts.password, recovery=True)
            if record.ledgers and min(ledger_ids) < record.ledgers[-1]:
                raise LogFencedError(
                    f"log {opts.log!r}: a writer added ledger {record.ledgers[-1]} while this "
                    "job was writing; positions must follow ledger order, so run it again"
                )
            try:
                await store.write_log(record.with_ledgers((*record.ledgers, *ledger_ids)))
                return
            except MetadataVersionError:
                continue
        raise MetadataVersionError(f"log {opts.log!r}: could not append the job's ledgers")


async def _allocate_id(opts: _Options) -> int:
    from aiobk.client import BookKeeper  # noqa: PLC0415

    async with await BookKeeper.connect(opts.metadata) as bk:
        return await bk.store.allocate_ledger_id()


async def _sweep(opts: _Options, job: str, first_id: int, keep: set[int]) -> None:
    """Delete the job's ledgers (ids after ``first_id``, tagged with ``job``) not in ``keep``:
    empty ones, and those of failed, killed or superseded task attempts."""
    from aiobk.client import BookKeeper  # noqa: PLC0415
    from aiobk.client.errors import NoSuchLedgerError  # noqa: PLC0415

    token = job.encode()
    async with await BookKeeper.connect(opts.metadata) as bk:
        async for ledger_id in bk.list_ledgers():
            if ledger_id <= first_id or ledger_id in keep:
                continue
            try:
                metadata = await bk.store.read_ledger(ledger_id)
                if metadata.custom_metadata.get("spark_job") == token:
                    await bk.delete_ledger(ledger_id)
            except NoSuchLedgerError:
                continue


def register(spark: Any) -> None:
    """Register the ``aiobk`` data source with a SparkSession."""
    spark.dataSource.register(AiobkDataSource)


def local_session(app: str = "aiobk", master: str = "local[2]") -> Any:
    """A local SparkSession whose Python workers run this interpreter (the project's venv),
    with the ``aiobk`` source registered. Without PYSPARK_PYTHON the workers would start the
    system Python, which has neither pyspark's dependencies nor aiobk."""
    from pyspark.sql import SparkSession  # noqa: PLC0415

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    register(spark)
    return spark
