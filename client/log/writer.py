"""The single writer of a named log (docs/design/logs.md; "A Guide to the BookKeeper
Replication Protocol", "Segment Based Logs").

Theory of operation.

*Taking the log.* Opening reads the log record, fences (opens with recovery) its last two
ledgers -- the previous writer may still be writing to the penultimate one while adding the
last -- creates a ledger and puts it at the end of the log by a compare-and-set that also
names this writer in the log record, by that ledger's id (``LogMetadata.writer``). The fencing
and the CAS together mean at most one writer can complete appends: the previous writer's next
append fails because its ledger is fenced, and its next change of the log record finds
another writer named there.

*Telling a takeover from maintenance.* A roll changes the log record by compare-and-set, and so
do truncation and retention. A roll that loses that race reads the record again: if it still
names this writer, someone trimmed the log (routine) and the roll simply tries again on what it
read; only another writer's name means the log was taken, and only that fails the writer
(``LogFencedError``). A fenced ledger is judged the same way: fenced by a takeover, the writer
stops; fenced by anything else (an operator's recovery), it recovers the ledger and moves on.

*Call order.* Positions follow the order of ``append`` calls, across rolls, failovers and
ensemble changes. An append is given an entry at once when nothing is ahead of it; otherwise it
joins a queue, and only the queue's pump -- one at a time, head first -- gives queued appends
entries. While a roll or a failover runs (a *transition*), every new append queues, so none can
overtake the ones waiting when the next ledger opens.

*Moving on.* A transition seals the current ledger -- a roll closes it after its appends; a
failure (no bookie to change the ensemble to, a bookie lost under a volatile ledger, a fence)
recovers it -- and so learns its last entry. The ledger's appends up to that entry are in the
log and resolve to their positions there; the ones after it are not, and go back to the head
of the queue, in their order, ahead of everything called later. No record is lost or written
twice, and the appender sees nothing of it but the positions.

*Producers.* A writer opened with a ``producer_id`` numbers its records: each carries the
producer id and a sequence that only goes up (its own, or the next after the last). Taking the
log, the writer learns the producer's last sequence durably in the log (``last_sequence``,
producers.py), so an append whose sequence is not above the last one accepted is not appended
again: ``append`` returns None for it, once the earlier append of that sequence, if still in
flight, is durable. Since positions follow call order and sealing keeps exactly the appends a
ledger holds, the durable sequences are always a prefix of the accepted ones.

The parts: ``ownership.LogOwnership`` takes the log, adds and seals its ledgers and judges
takeovers; this module keeps the appends in call order and runs the transitions.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, overload

from aiobk.client.ledger_handle import LedgerHandle
from aiobk.client.log.format import ENVELOPE, RAW, ProducerStamp, check_producer_id, encode
from aiobk.client.log.ledger_client import LedgerClient
from aiobk.client.log.ownership import LogOwnership
from aiobk.client.log.position import LogPosition
from aiobk.client.log.producers import DEFAULT_RETENTION
from aiobk.protocol import Durability
from aiobk.protocol.errors import (
    BKError,
    LedgerClosedError,
)

log = logging.getLogger(__name__)

FAILOVER_ATTEMPTS = 10  # consecutive ledgers that may fail before the writer gives up


@dataclass(frozen=True, slots=True)
class LogWriterSettings:
    """How a ``LogWriter`` writes (``BookKeeper.open_log_writer`` takes the same names)."""

    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    password: bytes = b""
    durability: Durability = Durability.PERSISTENT
    roll_bytes: int = 256 * 1024 * 1024  # start a new ledger past this many payload bytes
    roll_seconds: float | None = None  # ... or once the ledger is this old (None: never)
    create: bool = True  # create the log if it does not exist
    # The log's record format (log.format): a new log is created with it (None: envelope); an
    # existing log in another format is refused. None takes an existing log's.
    record_format: str | None = None
    clock: Callable[[], float] = time.time  # stamps envelope records (seconds; stored in ms)
    # Appends are numbered as this producer's (writer.py, "Producers"); None: plain appends.
    producer_id: str | None = None
    producer_retention: float = DEFAULT_RETENTION  # seconds a silent producer is remembered


class _Append:
    """One ``append`` call: its entry payload, where it was sent, and its caller's future."""

    __slots__ = ("data", "done", "entry_id", "ledger_id", "sequence", "settled", "waiters")

    def __init__(self, data: bytes, done: asyncio.Future[LogPosition], sequence: int = -1) -> None:
        self.data = data
        self.done = done
        self.sequence = sequence  # its producer's sequence (-1: a plain append)
        self.ledger_id = -1  # the ledger it was sent to (-1: not sent, or sent again later)
        self.entry_id = -1
        self.settled = False  # resolved to a position, or failed with the writer
        # Appends of the same sequence sent again while this one is in flight (_duplicate).
        self.waiters: list[asyncio.Future[None]] | None = None


def split_at(sent: deque[_Append], last: int) -> tuple[list[_Append], list[_Append]]:
    """A sealed ledger's unsettled appends (``sent`` in entry order): those in it -- entry ids up
    to ``last``, its last entry -- and those to send again, in their order."""
    kept: list[_Append] = []
    again: list[_Append] = []
    for append in sent:
        if not append.settled:
            (kept if append.entry_id <= last else again).append(append)
    return kept, again


class LogWriter:
    """The one writer of a log: appends records in call order, rolling to a new ledger by size
    or age and moving on from failed ledgers by itself. Made by
    ``BookKeeper.open_log_writer``; an async context manager that closes on exit.

    Attributes:
        name: The log.
        record_format: The log's record format (``"envelope"`` or ``"raw"``).
        last_sequence: A writer opened with a ``producer_id``: the producer's highest sequence
            durably in the log (learnt from the log when the writer opened, then its own
            appends'); -1 when there is none. Resume a producer at ``last_sequence + 1``.
    """

    def __init__(self, bk: LedgerClient, name: str, settings: LogWriterSettings) -> None:
        self.name = name
        self._settings = settings
        self._producer: bytes | None = None  # the producer id, encoded
        self._stamp: ProducerStamp | None = None  # its records' envelope, packed at once
        if settings.producer_id is not None:
            self._producer = check_producer_id(settings.producer_id)
            self._stamp = ProducerStamp(self._producer)
        self.last_sequence = -1  # the producer's last sequence durably in the log
        self._accepted = -1  # ... and the last one an append was accepted with
        self._in_flight: dict[int, _Append] = {}  # sequence: its append, until settled
        self._deduplicate = bk.config.switches.deduplicate_producers
        self._ownership = LogOwnership(bk, name, settings)  # the log record, its ledgers
        self._handle: LedgerHandle | None = None  # the ledger of the last sent appends
        self._opened_at = 0.0
        self._bytes = 0
        self._queue: deque[_Append] = deque()  # called, not yet sent: call order
        self._sent: deque[_Append] = deque()  # sent to _handle, entry order
        self._unsettled = 0  # appends called and not settled
        self._pump: asyncio.Task[None] | None = None
        self._transition: asyncio.Future[None] | None = None  # a roll or failover running
        self._transition_task: asyncio.Task[None] | None = None
        self._failovers = 0  # consecutive failed ledgers
        self._settled_all: asyncio.Future[None] | None = None  # close() waits on it
        self._error: BKError | None = None
        self._closed = False
        self.record_format = RAW  # the log's, once opened

    # ------------------------------------------------------------------ opening

    async def _open(self) -> None:
        handle, self.record_format = await self._ownership.take()
        if self._settings.producer_id is not None and self._deduplicate:
            self.last_sequence = self._ownership.producers_last(self._settings.producer_id)
            self._accepted = self.last_sequence
        self._started(handle)

    def _started(self, handle: LedgerHandle) -> None:
        self._handle = handle
        self._bytes = 0
        self._opened_at = asyncio.get_running_loop().time()
        log.info("log %s: writing to ledger %d", self.name, handle.ledger_id)

    # ------------------------------------------------------------------ appending

    @property
    def ledger_id(self) -> int:
        """The ledger appends go to now."""
        return self._handle.ledger_id if self._handle is not None else -1

    @overload
    async def append(
        self,
        data: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        timestamp: int | None = None,
    ) -> LogPosition: ...

    @overload
    async def append(
        self,
        data: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        timestamp: int | None = None,
        sequence: int,
    ) -> LogPosition | None: ...

    async def append(
        self,
        data: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        timestamp: int | None = None,
        sequence: int | None = None,
    ) -> LogPosition | None:
        """Append a record; return its position once it (and every record called before it)
        is durable. Positions follow the order of calls, across rolls and failovers.

        A log of ``"envelope"`` records stores ``key``, ``headers`` and ``timestamp``
        (milliseconds since the epoch; default the writer's clock now) with ``data``; a raw log
        stores the data alone and refuses them (``ValueError``). Raises ``LogFencedError``
        once another writer has taken the log, ``LedgerClosedError`` after ``close()``, and
        ``EntryTooLargeError`` for a record that cannot fit in one entry. A caller that is
        cancelled cancels only its wait: the record is still appended.

        A writer opened with a ``producer_id`` stores the producer and a ``sequence`` with
        each record: the one given, or the one after the last accepted. A ``sequence`` not
        above the last accepted (``last_sequence`` when the writer opened) is not appended
        again: the call returns None, once the earlier append of it, if still in flight, is
        durable. A ``sequence`` without a ``producer_id`` is ``ValueError``."""
        if self._error is not None:
            raise self._error
        if self._closed or self._handle is None:
            raise LedgerClosedError(f"log writer of {self.name!r} is closed")
        producer = self._producer
        if producer is not None:
            if sequence is None:
                sequence = self._accepted + 1
            elif sequence <= self._accepted and self._deduplicate:
                await self._duplicate(sequence)
                return None
        elif sequence is not None:
            raise ValueError(
                f"log {self.name!r}: a sequence needs a writer opened with a producer_id"
            )
        if self.record_format == ENVELOPE:
            if timestamp is None:
                timestamp = int(self._settings.clock() * 1000)
            stamp = self._stamp
            if stamp is not None and key is None and not headers and sequence is not None:
                data = stamp.encode(data, timestamp, sequence)
            else:
                data = encode(data, timestamp, key, headers, producer, sequence or 0)
        elif key is not None or headers or timestamp is not None:
            raise ValueError(
                f"log {self.name!r} holds raw records: a key, headers or a timestamp need a "
                "log created with record_format='envelope'"
            )
        handle = self._handle
        handle.check_size(data)  # refused now, never queued for what can never be sent
        append = _Append(bytes(data), asyncio.get_running_loop().create_future())
        if producer is not None and sequence is not None:
            append.sequence = self._accepted = sequence
            self._in_flight[sequence] = append
        self._unsettled += 1
        if self._transition is None and self._pump is None and not self._queue:
            try:
                started = handle.try_submit(append.data)
            except BKError as exc:
                self._queue.append(append)
                self._ledger_failed(handle, exc)
            else:
                if started is None:
                    self._queue.append(append)  # the budget is full: the pump waits for it
                    self._start_pump()
                else:
                    self._sent_to(handle, append, *started)
        else:
            self._queue.append(append)
            self._start_pump()
        return await append.done

    async def _duplicate(self, sequence: int) -> None:
        """An append of a sequence already accepted: nothing to append; wait for the earlier
        append of it if it is still in flight (its failure is this call's)."""
        earlier = self._in_flight.get(sequence)
        if earlier is None:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if earlier.waiters is None:
            earlier.waiters = []
        earlier.waiters.append(waiter)
        await waiter

    def _sent_to(
        self, handle: LedgerHandle, append: _Append, entry_id: int, confirmed: asyncio.Future[int]
    ) -> None:
        append.ledger_id = handle.ledger_id
        append.entry_id = entry_id
        self._sent.append(append)
        self._bytes += len(append.data)
        confirmed.add_done_callback(functools.partial(self._confirmed, handle, append))
        if self._due_to_roll():
            self._begin(self._roll(handle))

    def _confirmed(self, handle: LedgerHandle, append: _Append, done: asyncio.Future[int]) -> None:
        if append.settled or append.ledger_id != handle.ledger_id:
            return  # a transition settled it, or sent it again
        if done.cancelled():
            self._ledger_failed(
                handle, LedgerClosedError(f"ledger {handle.ledger_id}: add cancelled")
            )
            return
        exc = done.exception()
        if exc is None:
            self._failovers = 0
            self._settle(append, LogPosition(handle.ledger_id, append.entry_id))
            sent = self._sent
            while sent and sent[0].settled:
                sent.popleft()
        elif isinstance(exc, BKError):
            self._ledger_failed(handle, exc)
        else:
            self._fail(LedgerClosedError(f"log {self.name!r}: append failed: {exc!r}"))

    def _settle(self, append: _Append, position: LogPosition) -> None:
        append.settled = True
        sequence = append.sequence
        if sequence >= 0:
            self.last_sequence = max(self.last_sequence, sequence)
            self._in_flight.pop(sequence, None)
            if append.waiters is not None:
                for waiter in append.waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        if not append.done.done():
            append.done.set_result(position)
        self._unsettled -= 1
        if self._unsettled == 0:
            self._wake_close()

    def _wake_close(self) -> None:
        if self._settled_all is not None and not self._settled_all.done():
            self._settled_all.set_result(None)

    def _start_pump(self) -> None:
        if (
            self._pump is None
            and self._transition is None
            and self._queue
            and self._error is None
            and self._handle is not None
        ):
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def _run_pump(self) -> None:
        """Send the queue, head first, waiting for the client's budget when it is full. Stops
        at a transition (which starts it again when it ends) or a failed ledger."""
        me = asyncio.current_task()
        try:
            while self._queue and self._transition is None and self._error is None:
                handle = self._handle
                assert handle is not None
                head = self._queue[0]
                try:
                    started = handle.try_submit(head.data) or await handle.submit(head.data)
                except BKError as exc:
                    self._ledger_failed(handle, exc)
                    return
                # No await from the add's start to here: a transition that cancels this task
                # either finds the append unsent (at the head) or sent and known.
                self._queue.popleft()
                self._sent_to(handle, head, *started)
        finally:
            if self._pump is me:
                self._pump = None

    def _due_to_roll(self) -> bool:
        s = self._settings
        if self._transition is not None or self._error is not None:
            return False
        if self._bytes >= s.roll_bytes:
            return True
        age = asyncio.get_running_loop().time() - self._opened_at
        return s.roll_seconds is not None and age >= s.roll_seconds

    # ------------------------------------------------------------------ moving on

    def _ledger_failed(self, handle: LedgerHandle, exc: BKError) -> None:
        """An add to ``handle`` failed, or it refused one: move on from it, once. A transition
        already running handles it (a roll's close fails and falls back to recovery)."""
        if self._error is not None or handle is not self._handle or self._transition is not None:
            return
        log.warning("log %s: ledger %d failed (%s); recovering it and moving on",
                    self.name, handle.ledger_id, exc)  # fmt: skip
        self._begin(self._failover(handle, exc))

    def _begin(self, step: Coroutine[Any, Any, None]) -> None:
        """Run a transition: appends queue until it ends, then the pump sends them."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._transition = done
        pump = self._pump
        if pump is not None and pump is not asyncio.current_task():
            pump.cancel()  # it has sent nothing it has not recorded (see _run_pump)
        self._pump = None

        async def run() -> None:
            try:
                await step
            except BaseException as exc:
                error = exc if isinstance(exc, BKError) else None
                self._fail(error or LedgerClosedError(f"log {self.name!r}: roll failed: {exc!r}"))
                if not isinstance(exc, Exception):
                    raise
            finally:
                self._transition = None
                done.set_result(None)
                self._start_pump()

        self._transition_task = loop.create_task(run())

    async def _roll(self, old: LedgerHandle) -> None:
        """By size or age: close the current ledger after its appends, start the next."""
        await self._move_on(old, None)

    async def _failover(self, old: LedgerHandle, failure: BKError) -> None:
        self._failovers += 1
        if self._failovers > FAILOVER_ATTEMPTS:
            raise LedgerClosedError(
                f"log {self.name!r}: {FAILOVER_ATTEMPTS} ledgers in a row failed; last: {failure}"
            )
        await self._move_on(old, failure)

    async def _move_on(self, old: LedgerHandle, failure: BKError | None) -> None:
        last = await self._ownership.seal(old, failure)
        kept, again = split_at(self._sent, last)
        self._sent = deque()
        for append in kept:
            self._settle(append, LogPosition(old.ledger_id, append.entry_id))
        for append in again:
            append.ledger_id = append.entry_id = -1
        self._queue.extendleft(reversed(again))
        self._started(await self._ownership.add_ledger(self.last_sequence))

    def _fail(self, error: BKError) -> None:
        """The writer stops for good: every unsettled append fails with ``error``."""
        if self._error is None:
            self._error = error
        failed = [a for a in (*self._sent, *self._queue) if not a.settled]
        self._sent.clear()
        self._queue.clear()
        self._in_flight.clear()
        for append in failed:
            append.settled = True
            self._unsettled -= 1
            for waiter in append.waiters or ():
                if not waiter.done():
                    waiter.set_exception(error)
            if not append.done.done():
                append.done.set_exception(error)
                append.done.exception()  # the caller may have gone: no "never retrieved"
        self._wake_close()

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Wait for every append called before it, then close the current ledger. The log
        stays; a later writer adds its own ledger. Idempotent."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        while self._error is None:
            if self._transition is not None:
                await asyncio.shield(self._transition)
            elif self._unsettled:
                self._settled_all = loop.create_future()
                await asyncio.shield(self._settled_all)
            else:
                break
        if self._handle is not None and self._error is None:
            await self._handle.close()

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_log_writer(bk: LedgerClient, name: str, settings: LogWriterSettings) -> LogWriter:
    """Take the log ``name`` as its writer (see ``LogWriter``)."""
    writer = LogWriter(bk, name, settings)
    await writer._open()
    return writer
