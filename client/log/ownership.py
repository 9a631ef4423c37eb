"""A log writer's hold on the log record (writer.py's theory, "Taking the log" and "Telling a
takeover from maintenance").

It takes the log with a new ledger, puts the next ledger at the end of the log at a roll or a
failover, seals the ledger the writer leaves, and tells another writer's takeover from routine
changes of the record (a truncation, a retention pass) by the one fact that decides it: the
ledger this writer took the log with. The writer (writer.py) keeps the appends, their order and
the transitions; every read and compare-and-set of the log record, and every ledger made for
it, is here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Protocol

from aiobk.client.ledger_handle import LedgerHandle
from aiobk.client.log.append import take_log
from aiobk.client.log.format import RAW
from aiobk.client.log.ledger_client import LedgerClient
from aiobk.client.log.producers import PRODUCER_KEY, ProducerTable, learn
from aiobk.client.metadata_retry import MetadataRetry
from aiobk.metadata import LogMetadata, ProducerState
from aiobk.protocol import Durability
from aiobk.protocol.errors import BKError, LogFencedError, MetadataVersionError

log = logging.getLogger(__name__)


class LedgerSettings(Protocol):
    """What of a writer's settings (``LogWriterSettings``) the log's ledgers are made with."""

    @property
    def ensemble_size(self) -> int: ...
    @property
    def write_quorum(self) -> int: ...
    @property
    def ack_quorum(self) -> int: ...
    @property
    def password(self) -> bytes: ...
    @property
    def durability(self) -> Durability: ...
    @property
    def create(self) -> bool: ...
    @property
    def record_format(self) -> str | None: ...
    @property
    def producer_id(self) -> str | None: ...
    @property
    def producer_retention(self) -> float: ...
    @property
    def clock(self) -> Callable[[], float]: ...


class LogOwnership:
    """One writer's claim on the log ``name``: the ledgers it adds, and whether it still holds
    the log."""

    def __init__(self, bk: LedgerClient, name: str, settings: LedgerSettings) -> None:
        self._bk = bk
        self.name = name
        self._settings = settings
        self._taken_with = -1  # the ledger this writer took the log with: its name there
        # The log's producers, when it has any or this writer is one (producers.py).
        self.producers: ProducerTable | None = None

    def _now(self) -> int:
        return int(self._settings.clock() * 1000)

    def _producer_state(self, as_of: int, last_sequence: int) -> ProducerState | None:
        """What the log record keeps of its producers as of ledger ``as_of``, this writer's
        producer seen now with ``last_sequence``."""
        table = self.producers
        if table is None:
            return None
        s = self._settings
        now = self._now()
        if s.producer_id is not None:
            table.saw(s.producer_id, last_sequence, now)
        return table.state(as_of, now, int(s.producer_retention * 1000), s.producer_id)

    async def take(self) -> tuple[LedgerHandle, str]:
        """Take the log with a new ledger; return it and the log's record format. A writer
        with a producer id also learns every producer's last sequence (``producers``)."""
        s = self._settings
        retry = MetadataRetry(self._bk.config, f"log {self.name}: taking it")
        for _attempt in range(self._bk.config.metadata_retries):
            record = await take_log(
                self._bk, self.name, s.password, create=s.create, record_format=s.record_format
            )
            if s.producer_id is not None and record.record_format == RAW:
                raise ValueError(
                    f"log {self.name!r} holds raw records: a producer id needs a log created "
                    "with record_format='envelope'"
                )
            if record.producers is not None or s.producer_id is not None:
                self.producers = await learn(self._bk, record, s.password, self._now())
            handle = await self._create_ledger()
            mine = -1 if s.producer_id is None else self.producers_last(s.producer_id)
            wanted = record.taken(
                (*record.ledgers, handle.ledger_id),
                handle.ledger_id,
                self._producer_state(handle.ledger_id, mine),
            )
            try:
                await retry.call(
                    "taking the log", functools.partial(self._bk.store.write_log, wanted)
                )
            except MetadataVersionError:
                now = await self._read_record(retry)
                if now.writer == handle.ledger_id:
                    self._taken_with = handle.ledger_id
                    return handle, record.record_format  # an earlier attempt landed
                await self._discard(handle)
                if now.writer != record.writer:
                    raise LogFencedError(
                        f"log {self.name!r}: another writer took it while this one opened"
                    ) from None
                continue  # the log changed (a roll of the previous writer, a truncation)
            except BKError:
                await self._discard(handle)
                raise
            self._taken_with = handle.ledger_id
            return handle, record.record_format
        raise MetadataVersionError(f"log {self.name!r}: taking it kept losing races")

    def producers_last(self, producer: str) -> int:
        """The producer's last sequence in the log as this writer knows it; -1: none."""
        return -1 if self.producers is None else self.producers.last_sequence(producer)

    async def _create_ledger(self) -> LedgerHandle:
        s = self._settings
        custom = {"log": self.name.encode()}
        if s.producer_id is not None:
            custom[PRODUCER_KEY] = s.producer_id.encode()  # its last entry holds one's sequence
        return await self._bk.create_ledger(
            s.ensemble_size,
            s.write_quorum,
            s.ack_quorum,
            password=s.password,
            durability=s.durability,
            custom_metadata=custom,
        )

    async def _read_record(self, retry: MetadataRetry) -> LogMetadata:
        return await retry.call(
            "reading the log", functools.partial(self._bk.store.read_log, self.name)
        )

    def _taken_over(self, record: LogMetadata) -> LogFencedError | None:
        if record.writer == self._taken_with:
            return None
        return LogFencedError(
            f"log {self.name!r}: another writer took it over (the writer that took it with "
            f"ledger {record.writer}; this one took it with ledger {self._taken_with})"
        )

    async def _discard(self, handle: LedgerHandle) -> None:
        try:
            await handle.close()
            await self._bk.delete_ledger(handle.ledger_id, self._settings.password)
        except BKError as exc:
            log.warning("log %s: could not remove unused ledger %d: %s",
                        self.name, handle.ledger_id, exc)  # fmt: skip

    async def seal(self, old: LedgerHandle, failure: BKError | None) -> int:
        """The last entry of ``old`` once no further add can land in it: closed after its
        appends, or -- when it failed -- recovered, as a reader would (this also learns which
        in-flight appends made it). Raises ``LogFencedError`` if another writer took the log."""
        if failure is None:
            try:
                await old.close()
            except BKError as exc:
                failure = exc
            else:
                last = old.metadata.last_entry_id
                assert last is not None  # closed
                return last
        retry = MetadataRetry(self._bk.config, f"log {self.name}: recovering a failed ledger")
        taken = self._taken_over(await self._read_record(retry))
        if taken is not None:
            raise taken from failure
        reader = await self._bk.open_ledger(old.ledger_id, self._settings.password, recovery=True)
        with contextlib.suppress(BKError):
            await reader.close()
        return reader.last_add_confirmed

    async def add_ledger(self, last_sequence: int = -1) -> LedgerHandle:
        """Create the next ledger and put it at the end of the log, as long as the log is still
        this writer's; a routine change of the record (a truncation) just means trying again.
        ``last_sequence``: this writer's producer's last durable one, kept in the record."""
        handle = await self._create_ledger()
        producers = self._producer_state(handle.ledger_id, last_sequence)
        retry = MetadataRetry(self._bk.config, f"log {self.name}: adding a ledger")
        try:
            for _attempt in range(self._bk.config.metadata_retries):
                record = await self._read_record(retry)
                taken = self._taken_over(record)
                if taken is not None:
                    raise taken
                if record.ledgers[-1:] == (handle.ledger_id,):
                    break  # a compare-and-set retried after its first attempt landed
                if record.ledgers and handle.ledger_id < record.ledgers[-1]:
                    raise LogFencedError(
                        f"log {self.name!r}: it ends with ledger {record.ledgers[-1]}, after "
                        f"this writer's new ledger {handle.ledger_id}"
                    )
                wanted = record.with_ledgers((*record.ledgers, handle.ledger_id))
                if producers is not None:
                    wanted = wanted.with_producers(producers)
                try:
                    await retry.call(
                        "updating the log", functools.partial(self._bk.store.write_log, wanted)
                    )
                    break
                except MetadataVersionError:
                    continue  # changed since read: read it again
            else:
                raise MetadataVersionError(f"log {self.name!r}: adding a ledger kept losing races")
        except BKError:
            await self._discard(handle)
            raise
        return handle
