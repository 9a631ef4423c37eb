"""A raw-protocol client for hostile tests: asyncio streams around the pure codec.

Unlike ``client.BookieConnection`` it does whatever a peer may do: send arbitrary bytes, send
requests the client library would never build, pipeline thousands of requests without reading
one answer (the socket's receive buffer then fills and the bookie's writes back up), and hold a
connection open doing nothing. Answers are read only when a test asks for them, each stamped
with the loop time of the read that brought it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable

from aiobk.protocol import (
    FrameDecoder,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    Request,
    Response,
    decode_response,
    encode,
)

READ_CHUNK = 256 * 1024
MAX_FRAME = 64 * 1024 * 1024  # the client side accepts whatever a bookie may send


class PeerClosedError(ConnectionError):
    """The bookie closed the connection before the answers a test waited for."""


class RawConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._decoder = FrameDecoder(MAX_FRAME)
        self._txn_ids = itertools.count(1)
        self._loop = asyncio.get_running_loop()
        self.received: dict[int, tuple[float, Response]] = {}  # txn_id -> (arrival, answer)
        self.eof = False

    @classmethod
    async def open(cls, host: str, port: int, timeout: float = 5.0) -> RawConnection:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, limit=READ_CHUNK)
        return cls(reader, writer)

    # ------------------------------------------------------------------ sending

    def next_txn_id(self) -> int:
        return next(self._txn_ids)

    def send(self, request: Request) -> int:
        """Queue one request (no drain, no answer awaited); return its txn id."""
        self.writer.write(encode(request))
        return request.txn_id

    def send_many(self, requests: Iterable[Request]) -> list[int]:
        """Queue many requests in one write."""
        batch = list(requests)
        self.writer.write(b"".join(encode(r) for r in batch))
        return [r.txn_id for r in batch]

    def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)

    async def drain(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self.writer.drain()

    # ------------------------------------------------------------------ receiving

    async def read_some(self, timeout: float) -> int:
        """Read one chunk and decode what it completes; return how many answers it held.
        Raises PeerClosedError at end of stream, TimeoutError if nothing came."""
        async with asyncio.timeout(timeout):
            data = await self.reader.read(READ_CHUNK)
        if not data:
            self.eof = True
            raise PeerClosedError("the bookie closed the connection")
        now = self._loop.time()
        frames = self._decoder.feed(data)
        for payload in frames:
            response = decode_response(payload)
            self.received[response.txn_id] = (now, response)
        return len(frames)

    async def wait_for(self, txn_ids: Iterable[int], timeout: float) -> dict[int, Response]:
        """Read until every one of ``txn_ids`` is answered (others are kept for later)."""
        wanted = set(txn_ids)
        deadline = self._loop.time() + timeout
        while not wanted <= self.received.keys():
            await self.read_some(max(0.0, deadline - self._loop.time()))
        return {txn: self.received[txn][1] for txn in wanted}

    async def call(self, request: Request, timeout: float = 10.0) -> Response:
        self.send(request)
        return (await self.wait_for([request.txn_id], timeout))[request.txn_id]

    async def closed_by_peer(self, timeout: float) -> bool:
        """Read (and keep) answers until the bookie closes the connection: True if it did
        within ``timeout``."""
        deadline = self._loop.time() + timeout
        try:
            while True:
                await self.read_some(max(0.0, deadline - self._loop.time()))
        except PeerClosedError:
            return True
        except ConnectionError:
            self.eof = True  # reset by the bookie (an abort)
            return True
        except TimeoutError:
            return False

    async def stats(self, timeout: float = 10.0) -> dict[str, int]:
        """The bookie's counters (GET_BOOKIE_INFO)."""
        response = await self.call(GetBookieInfoRequest(self.next_txn_id()), timeout)
        assert isinstance(response, GetBookieInfoResponse), response
        return dict(response.stats)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        if not self.writer.transport.is_closing():
            self.writer.close()

    def abort(self) -> None:
        """Close at once, dropping whatever is unsent (idempotent)."""
        transport = self.writer.transport
        if not transport.is_closing():
            transport.abort()


async def bookie_stats(host: str, port: int, timeout: float = 10.0) -> dict[str, int]:
    """The counters of the bookie at ``host:port``, over a connection of its own."""
    conn = await RawConnection.open(host, port, timeout)
    try:
        return await conn.stats(timeout)
    finally:
        conn.close()
