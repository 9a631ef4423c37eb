"""Reading a log: its closed ledgers in order, then the open one followed with long polls; when
that ledger is closed and a next one appears in the log record (watched), reading moves on.

A reader that does not follow (``follow=False``) fixes its end first (``find_end``): the log's
ledgers as its record lists them then, the last of them read up to the LAC its bookies report
then. It reads to that end and stops, so a script can read a log "to its end" while a writer
keeps appending. Neither kind fences: only a writer opening the log does.

Positions are exact, so a reader that saved the position of the last record it processed
resumes with ``start=position.next()`` and sees neither a gap nor a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiobk.client.entry import Entry
from aiobk.client.log.format import RAW, check_format
from aiobk.client.log.ledger_client import LedgerClient
from aiobk.client.log.position import LogPosition, LogRecord, log_record
from aiobk.client.passwords import check_delete
from aiobk.client.read_handle import ReadHandle
from aiobk.metadata import LogMetadata, OffloadRecord
from aiobk.protocol.errors import MetadataVersionError, NoSuchLedgerError, NoSuchLogError


class LogReader:
    """Reads a log in position order, made by ``BookKeeper.open_log_reader``; iterate it with
    ``async for record in reader`` to get ``LogRecord``s.

    Following (``follow=True``, the default), it tails the log: past the last record it waits
    for new ones, across the writer's rolls, and never ends on its own. With ``follow=False``
    it stops at the end the log had when it was opened (``end``). It never fences a ledger, so
    reading never disturbs a live writer. ``position`` is the next position it will read:
    save it to resume later with ``open_log_reader(name, start=position)``."""

    def __init__(
        self,
        bk: LedgerClient,
        name: str,
        start: LogPosition,
        password: bytes = b"",
        *,
        follow: bool = True,
    ) -> None:
        self._bk = bk
        self.name = name
        self.position = start  # the next position to read
        self._password = password
        self.follow = follow
        # follow=False: the position of the last record to read (None: nothing to read), the
        # log's ledgers and the handle of the end's ledger when find_end ran.
        self.end: LogPosition | None = None
        self._ledgers: tuple[int, ...] | None = None
        self._end_handle: ReadHandle | None = None
        self.record_format: str | None = None  # the log's, once its record was read

    def __aiter__(self) -> AsyncIterator[LogRecord]:
        return self._records() if self.follow else self._to_end()

    async def find_end(self) -> LogPosition | None:
        """Fix where a reader that does not follow stops: the last record it will return,
        None when there is none at or after its position. Runs at the first iteration unless
        called before (``open_log_reader(follow=False)`` calls it). Raises NoSuchLogError."""
        record = await self._bk.store.read_log(self.name)
        self.record_format = check_format(record.record_format)
        self._ledgers = tuple(i for i in record.ledgers if i >= self.position.ledger_id)
        self.end = None
        self._end_handle = None
        for ledger_id in reversed(self._ledgers):  # an empty last ledger: the one before
            try:
                handle = await self._bk.open_ledger(ledger_id, self._password, recovery=False)
            except NoSuchLedgerError:
                continue  # truncated away meanwhile
            if handle.last_add_confirmed >= 0:
                self.end = LogPosition(ledger_id, handle.last_add_confirmed)
                self._end_handle = handle
                break
        return self.end

    async def _to_end(self) -> AsyncIterator[LogRecord]:
        if self._ledgers is None:
            await self.find_end()
        end, ledgers = self.end, self._ledgers or ()
        if end is None:
            return
        for ledger_id in ledgers:
            if ledger_id > end.ledger_id:
                break
            if ledger_id < self.position.ledger_id:
                continue
            first = self.position.entry_id if ledger_id == self.position.ledger_id else 0
            try:
                if ledger_id == end.ledger_id and self._end_handle is not None:
                    handle, last = self._end_handle, end.entry_id
                else:
                    handle = await self._bk.open_ledger(ledger_id, self._password, recovery=False)
                    last = handle.last_add_confirmed
                if max(first, 0) <= last:
                    stream = handle.read_iter(max(first, 0), last)
                    async with contextlib.aclosing(stream):
                        async for entry in stream:
                            at = LogPosition(ledger_id, entry.entry_id)
                            record = log_record(at, entry.data, self.record_format or RAW)
                            self.position = at.next()
                            yield record
            except NoSuchLedgerError:
                pass  # truncated away under the reader
            if ledger_id < end.ledger_id:  # the end's ledger may grow: resume inside it
                self.position = LogPosition(ledger_id + 1, 0)

    async def _records(self) -> AsyncIterator[LogRecord]:
        store = self._bk.store
        watch = store.watch_log(self.name)
        try:
            record = await anext(watch)
            while True:
                if record is None:
                    raise NoSuchLogError(f"log {self.name!r} does not exist")
                fmt = self.record_format = check_format(record.record_format)
                ledger_id = self._next_ledger(record)
                if ledger_id is None:
                    record = await anext(watch)  # wait for a writer to add a ledger
                    continue
                first = self.position.entry_id if ledger_id == self.position.ledger_id else 0
                async for entry in self._ledger(ledger_id, max(first, 0)):
                    at = LogPosition(ledger_id, entry.entry_id)
                    entry_record = log_record(at, entry.data, fmt)
                    self.position = at.next()
                    yield entry_record
                # Done with this ledger (closed and read, or truncated away).
                self.position = LogPosition(ledger_id + 1, 0)
                record = await store.read_log(self.name)
        finally:
            closer = getattr(watch, "aclose", None)  # an async generator's
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()

    def _next_ledger(self, record: LogMetadata) -> int | None:
        """The first ledger of the log at or after the read position."""
        for ledger_id in record.ledgers:
            if ledger_id >= self.position.ledger_id:
                return ledger_id
        return None

    async def _ledger(self, ledger_id: int, first: int) -> AsyncIterator[Entry]:
        try:
            handle = await self._bk.open_ledger(ledger_id, self._password, recovery=False)
            async for entry in handle.read_from(first):
                yield entry
        except NoSuchLedgerError:
            return  # truncated away under the reader


async def check_deletes(
    bk: LedgerClient, ledger_ids: Sequence[int], password: bytes | None
) -> dict[int, OffloadRecord]:
    """``UnauthorizedError`` unless ``delete_ledger`` would delete each of ``ledger_ids`` with
    ``password`` (those already gone pass): asked before a log changes, so a refusal leaves
    the log and its ledgers as they were. Returns the offload records of those that have one,
    whose objects go with them (``LedgerClient.forget_offload``)."""
    offloaded: dict[int, OffloadRecord] = {}

    async def check(ledger_id: int) -> None:
        try:
            metadata = await bk.store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            return
        check_delete(ledger_id, metadata, password)
        if metadata.offload is not None:
            offloaded[ledger_id] = metadata.offload

    await _each(check, ledger_ids)
    return offloaded


# Metadata calls a truncation keeps in flight at once: etcd commits concurrent writes together,
# so a hundred ledgers go in a few of its commits instead of a hundred in turn.
CONCURRENT_METADATA_CALLS = 16


async def _each(call: Callable[[int], Awaitable[None]], ledger_ids: Sequence[int]) -> None:
    """``call`` on every id, ``CONCURRENT_METADATA_CALLS`` at a time; the first error is
    raised once every call has ended."""
    limit = asyncio.Semaphore(CONCURRENT_METADATA_CALLS)

    async def one(ledger_id: int) -> None:
        async with limit:
            await call(ledger_id)

    results = await asyncio.gather(*(one(i) for i in ledger_ids), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def truncate_log(
    bk: LedgerClient,
    name: str,
    before: LogPosition,
    password: bytes | None = None,
    *,
    force: bool = False,
) -> list[int]:
    """Remove from the log every ledger wholly below ``before`` (never its last ledger, which
    a writer may be using), by CAS, then delete those ledgers. Returns their ids. Unless
    ``force``, every one of them must take ``password`` (``check_deletes``) before the log
    changes."""
    store = bk.store
    checked: set[int] = set()  # passwords checked once: a retry reads and writes, no more
    offloaded: dict[int, OffloadRecord] = {}  # their objects go with them
    for _attempt in range(bk.config.metadata_retries):
        record = await store.read_log(name)
        keep_from = len(record.ledgers) - 1
        for index, ledger_id in enumerate(record.ledgers):
            if ledger_id >= before.ledger_id:
                keep_from = min(index, keep_from)
                break
        removed = record.ledgers[:keep_from]
        if not removed:
            return []
        if not force:
            offloaded.update(
                await check_deletes(bk, [i for i in removed if i not in checked], password)
            )
            checked.update(removed)
        try:
            await store.write_log(record.with_ledgers(record.ledgers[keep_from:]))
        except MetadataVersionError:
            await asyncio.sleep(0)
            continue

        async def delete(ledger_id: int) -> None:
            with contextlib.suppress(NoSuchLedgerError):
                await bk.delete_ledger(ledger_id, force=True)
            if ledger_id in offloaded:
                await bk.forget_offload(ledger_id, offloaded[ledger_id])

        await _each(delete, removed)
        return list(removed)
    raise MetadataVersionError(f"log {name!r}: truncation kept losing races")
