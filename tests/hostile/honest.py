"""The honest client beside an attack: adds and reads on its own connection, at a steady pace,
timing each one. It uses the client library's ``BookieConnection``, as real writers do."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from aiobk.client import BookieConnection, Digester
from aiobk.protocol import (
    AddRequest,
    AddResponse,
    DigestType,
    ReadRequest,
    ReadResponse,
    StatusCode,
    master_key,
)
from aiobk.protocol.errors import BKError

DIGEST = Digester(DigestType.CRC32C)
KEY = master_key(b"hostile-tests")
HONEST_LEDGER = 7  # the honest client's own ledger; attacks use other ids
REQUEST_TIMEOUT = 30.0  # long: a slow answer is measured, not turned into an error


def entry_body(ledger: int, entry: int, payload: bytes, lac: int = -1) -> bytes:
    return DIGEST.encode(ledger, entry, lac, len(payload), payload)


def add_request(
    txn_id: int, ledger: int, entry: int, payload: bytes, key: bytes = KEY, lac: int = -1
) -> AddRequest:
    return AddRequest(
        txn_id, ledger, entry, master_key=key, body=entry_body(ledger, entry, payload, lac)
    )


class HonestClient:
    """Alternates an add to ``HONEST_LEDGER`` and a read of ``(read_ledger, read_entry)``."""

    def __init__(
        self,
        host: str,
        port: int,
        read_ledger: int = HONEST_LEDGER,
        read_entry: int = 0,
        interval: float = 0.05,
    ) -> None:
        self.host, self.port = host, port
        self.read_ledger, self.read_entry = read_ledger, read_entry
        self.interval = interval
        self.latencies: list[float] = []
        self.read_latencies: list[float] = []  # the reads' alone (an add waits for the journal)
        self.failures: list[str] = []
        self.next_entry = 0
        self.conn: BookieConnection | None = None

    async def add(self, payload: bytes = b"honest") -> AddResponse:
        assert self.conn is not None
        entry = self.next_entry
        self.next_entry += 1
        request = add_request(self.conn.next_txn_id(), HONEST_LEDGER, entry, payload)
        response = await self.conn.send(request, REQUEST_TIMEOUT)
        assert isinstance(response, AddResponse)
        return response

    async def read(self) -> ReadResponse:
        assert self.conn is not None
        request = ReadRequest(self.conn.next_txn_id(), self.read_ledger, self.read_entry)
        response = await self.conn.send(request, REQUEST_TIMEOUT)
        assert isinstance(response, ReadResponse)
        return response

    async def _timed(self, operation: str) -> None:
        start = time.monotonic()
        try:
            response = await (self.add() if operation == "add" else self.read())
        except BKError as exc:
            self.failures.append(f"{operation}: {exc!r}")
            return
        self.latencies.append(time.monotonic() - start)
        if operation == "read":
            self.read_latencies.append(self.latencies[-1])
        if response.status is not StatusCode.EOK:
            self.failures.append(f"{operation}: {response.status.name}")

    async def _loop(self) -> None:
        while True:
            await self._timed("add")
            await self._timed("read")
            await asyncio.sleep(self.interval)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[HonestClient]:
        """Connected, with its first entry written, adding and reading until the block ends."""
        self.conn = await BookieConnection.open(self.host, self.port)
        try:
            first = await self.add()
            assert first.status is StatusCode.EOK, first
            task = asyncio.get_running_loop().create_task(self._loop())
            try:
                yield self
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            self.conn.close()
