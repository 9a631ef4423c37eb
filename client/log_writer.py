"""The single writer of a named log (protocol.md "Opening a log"; the guide's "Segment Based
Logs").

Opening: read the log's ledger list, fence (open with recovery) its last two ledgers -- the
previous writer may still be writing to the penultimate one while adding the last -- create a
ledger and add it to the list by compare-and-set. The fencing and the CAS together mean at
most one writer can complete appends: a lost CAS means another writer won, and the loser gets
``LogFencedError``; the previous writer's next append fails because its ledger is fenced.

Rolling to a new ledger happens by size or age (settings), and when the current ledger fails
in a way it cannot survive (no bookie to change the ensemble to, a bookie lost under a
volatile ledger). On a failure the ledger is recovered first, so the writer knows exactly
which of its in-flight appends made it: those resolve to their positions in the old ledger,
the others are appended again to the new one. No record is lost or written twice, and the
appender sees nothing of it but the positions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiobk.client.ledger_client import LedgerClient
from aiobk.client.ledger_handle import LedgerHandle
from aiobk.client.log_append import take_log
from aiobk.client.log_format import ENVELOPE, RAW, encode
from aiobk.client.log_position import LogPosition
from aiobk.client.metadata_retry import MetadataRetry
from aiobk.metadata import LogRecord
from aiobk.protocol import Durability
from aiobk.protocol.errors import (
    BKError,
    LedgerClosedError,
    LedgerFencedError,
    LogFencedError,
    MetadataVersionError,
)

log = logging.getLogger(__name__)

FAILOVER_ATTEMPTS = 10  # consecutive ledgers that may fail before the writer gives up


@dataclass(frozen=True, slots=True)
class LogWriterSettings:
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    password: bytes = b""
    durability: Durability = Durability.PERSISTENT
    roll_bytes: int = 256 * 1024 * 1024  # start a new ledger past this many payload bytes
    roll_seconds: float | None = None  # ... or once the ledger is this old (None: never)
    create: bool = True  # create the log if it does not exist
    # The log's record format (log_format): a new log is created with it (None: raw); an
    # existing log in another format is refused. None takes an existing log's.
    record_format: str | None = None
    clock: Callable[[], float] = time.time  # stamps envelope records (seconds; stored in ms)


class LogWriter:
    def __init__(self, bk: LedgerClient, name: str, settings: LogWriterSettings) -> None:
        self._bk = bk
        self.name = name
        self._settings = settings
        self._handle: LedgerHandle | None = None
        self._opened_at = 0.0
        self._bytes = 0
        self._rolling: asyncio.Future[None] | None = None
        self._failed_ledgers: dict[int, asyncio.Future[int]] = {}  # ledger -> recovered end
        self._error: BKError | None = None
        self._closed = False
        self.record_format = RAW  # the log's, once opened

    # ------------------------------------------------------------------ opening

    async def _open(self) -> None:
        s = self._settings
        record = await take_log(
            self._bk, self.name, s.password, create=s.create, record_format=s.record_format
        )
        self.record_format = record.record_format
        await self._add_ledger(record)

    async def _add_ledger(self, record: LogRecord) -> None:
        """Create a ledger and put it at the end of the log by CAS on ``record``'s version."""
        s = self._settings
        handle = await self._bk.create_ledger(
            s.ensemble_size,
            s.write_quorum,
            s.ack_quorum,
            password=s.password,
            durability=s.durability,
            custom_metadata={"log": self.name.encode()},
        )
        wanted = record.with_ledgers((*record.ledgers, handle.ledger_id))
        store = self._bk.store
        # Ridden out while the store is unreachable, as the ledger's creation was; a retried
        # compare-and-set whose first attempt landed comes back as a version error, told apart
        # from another writer's change by reading the log again.
        retry = MetadataRetry(self._bk.config, f"log {self.name}: adding a ledger")
        try:
            try:
                await retry.call("updating the log", functools.partial(store.write_log, wanted))
            except MetadataVersionError:
                now = await retry.call(
                    "reading the log", functools.partial(store.read_log, self.name)
                )
                if now.ledgers != wanted.ledgers:
                    raise
        except MetadataVersionError:
            await self._discard(handle)
            error = LogFencedError(f"log {self.name!r}: another writer took it over")
            self._fail(error)
            raise error from None
        except BKError:
            await self._discard(handle)
            raise
        self._handle = handle
        self._bytes = 0
        self._opened_at = asyncio.get_running_loop().time()
        log.info("log %s: writing to ledger %d", self.name, handle.ledger_id)

    async def _discard(self, handle: LedgerHandle) -> None:
        try:
            await handle.close()
            await self._bk.delete_ledger(handle.ledger_id, self._settings.password)
        except BKError as exc:
            log.warning("log %s: could not remove unused ledger %d: %s",
                        self.name, handle.ledger_id, exc)  # fmt: skip

    # ------------------------------------------------------------------ appending

    @property
    def ledger_id(self) -> int:
        """The ledger appends go to now."""
        return self._handle.ledger_id if self._handle is not None else -1

    async def append(
        self,
        data: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        timestamp: int | None = None,
    ) -> LogPosition:
        """Append ``data``; its position once it (and everything before it in its ledger) is
        durable. Raises ``LogFencedError`` once another writer has taken the log.

        A log of ``"envelope"`` records stores ``key``, ``headers`` and ``timestamp``
        (milliseconds since the epoch; default the writer's clock now) with the data; a raw
        log stores the data alone and refuses them (ValueError)."""
        if self.record_format == ENVELOPE:
            if timestamp is None:
                timestamp = int(self._settings.clock() * 1000)
            data = encode(data, timestamp, key, headers)
        elif key is not None or headers or timestamp is not None:
            raise ValueError(
                f"log {self.name!r} holds raw records: a key, headers or a timestamp need a "
                "log created with record_format='envelope'"
            )
        for _attempt in range(FAILOVER_ATTEMPTS):
            handle = await self._ready()
            try:
                entry_id, confirmed = await handle.submit(data)
            except LedgerClosedError:
                continue  # rolled meanwhile
            except BKError as exc:
                await self._on_failure(handle, exc)
                continue
            self._bytes += len(data)
            if self._due_to_roll():
                self._start_roll(self._roll)
            try:
                return LogPosition(handle.ledger_id, await confirmed)
            except BKError as exc:
                last = await self._on_failure(handle, exc)
                if entry_id <= last:
                    return LogPosition(handle.ledger_id, entry_id)  # it made it after all
        raise self._error or LedgerClosedError(f"log {self.name!r}: too many failed ledgers")

    async def _ready(self) -> LedgerHandle:
        while True:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise LedgerClosedError(f"log writer of {self.name!r} is closed")
            if self._rolling is not None:
                await asyncio.shield(self._rolling)
                continue
            if self._handle is None:
                raise LedgerClosedError(f"log writer of {self.name!r} has no ledger")
            return self._handle

    def _due_to_roll(self) -> bool:
        s = self._settings
        if self._rolling is not None or self._error is not None:
            return False
        if self._bytes >= s.roll_bytes:
            return True
        age = asyncio.get_running_loop().time() - self._opened_at
        return s.roll_seconds is not None and age >= s.roll_seconds

    def _start_roll(self, step: Callable[[], Awaitable[None]]) -> asyncio.Future[None]:
        """Run ``step`` (a roll or a failover) while appends wait for it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._rolling = done

        async def run() -> None:
            try:
                await step()
                done.set_result(None)
            except BaseException as exc:
                if not isinstance(exc, BKError):
                    exc = LedgerClosedError(f"log {self.name!r}: roll failed: {exc!r}")
                self._fail(exc)
                done.set_exception(exc)
                done.exception()
            finally:
                self._rolling = None

        task = loop.create_task(run())
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
        return done

    async def _roll(self) -> None:
        """By size or age: close the current ledger (after its appends), start the next."""
        old = self._handle
        assert old is not None
        await old.close()
        await self._add_ledger(await self._bk.store.read_log(self.name))

    async def _on_failure(self, handle: LedgerHandle, exc: BKError) -> int:
        """The current ledger failed under an append: recover it (once) and move on to a new
        ledger. Returns the recovered ledger's last entry id."""
        if isinstance(exc, LedgerFencedError):
            error = LogFencedError(f"log {self.name!r}: another writer fenced ledger "
                                   f"{handle.ledger_id}")  # fmt: skip
            self._fail(error)
            raise error from exc
        pending = self._failed_ledgers.get(handle.ledger_id)
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = self._failed_ledgers[handle.ledger_id] = loop.create_future()
            log.warning("log %s: ledger %d failed (%s); recovering it and moving on",
                        self.name, handle.ledger_id, exc)  # fmt: skip

            async def failover() -> None:
                reader = await self._bk.open_ledger(
                    handle.ledger_id, self._settings.password, recovery=True
                )
                pending.set_result(reader.last_add_confirmed)
                await self._add_ledger(await self._bk.store.read_log(self.name))

            rolled = self._start_roll(failover)
            try:
                await asyncio.shield(rolled)
            except BKError:
                if not pending.done():
                    pending.set_exception(self._error or exc)
                    pending.exception()
        return await asyncio.shield(pending)

    def _fail(self, error: BKError) -> None:
        if self._error is None:
            self._error = error

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Close the current ledger (after its appends). The log stays; a later writer adds
        its own ledger. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._rolling is not None:
            with contextlib.suppress(BKError):
                await asyncio.shield(self._rolling)
        if self._handle is not None and self._error is None:
            await self._handle.close()

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_log_writer(bk: LedgerClient, name: str, settings: LogWriterSettings) -> LogWriter:
    writer = LogWriter(bk, name, settings)
    await writer._open()
    return writer
