"""One pipelined connection to one bookie.

In-flight requests live in ``dict[txn_id, Future]`` (STYLE 3); responses may arrive in any
order. Requests queued in one event-loop turn leave in one write. Every request has a deadline:
past it the future fails with ``OperationTimeoutError`` and a late answer is dropped. When the
connection closes, every pending request fails with ``BookieUnavailableError`` chaining the
cause, and the connection is done: the owner opens a new one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TypeVar, cast

from client.net import AsyncioConnector, Connector
from protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    ErrorResponse,
    FrameDecoder,
    FrameError,
    HandshakeRequest,
    HandshakeResponse,
    MalformedMessageError,
    Request,
    Response,
    StatusCode,
    decode_response,
    encode,
)
from protocol.errors import (
    BadRequestError,
    BookieUnavailableError,
    OperationTimeoutError,
    error_for_status,
)

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Response)


class _Pending:
    __slots__ = ("future", "timer")

    def __init__(self, future: asyncio.Future[Response], timer: asyncio.TimerHandle) -> None:
        self.future = future
        self.timer = timer


class BookieConnection(asyncio.Protocol):
    def __init__(self, address: str, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.address = address
        self.bookie_id = ""
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder(max_frame_size)
        self._max_frame = max_frame_size
        self._pending: dict[int, _Pending] = {}
        self._next_txn = 1
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._transport: asyncio.Transport | None = None
        self._closed_error: BookieUnavailableError | None = None
        self._write_ready: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ opening

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = 5.0,
        connector: Connector | None = None,
        expected_bookie_id: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        client_name: str = "aiobk",
    ) -> BookieConnection:
        """Connect and handshake within ``timeout``; raise BookieUnavailableError otherwise."""
        address = f"{host}:{port}"
        connector = connector or AsyncioConnector()
        try:
            _transport, conn = await asyncio.wait_for(
                connector.connect(lambda: cls(address, max_frame_size), host, port), timeout
            )
        except (TimeoutError, OSError) as exc:
            raise BookieUnavailableError(f"cannot connect to bookie {address}: {exc}") from exc
        try:
            hello = await conn.call(HandshakeRequest(0, PROTOCOL_VERSION, client_name), timeout)
        except BaseException:
            conn.close()
            raise
        assert isinstance(hello, HandshakeResponse)
        if expected_bookie_id is not None and hello.bookie_id != expected_bookie_id:
            conn.close()
            raise BookieUnavailableError(
                f"{address} is bookie {hello.bookie_id!r}, not {expected_bookie_id!r}"
            )
        conn.bookie_id = hello.bookie_id
        return conn

    # ------------------------------------------------------------------ requests

    @property
    def closed(self) -> bool:
        return self._closed_error is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def next_txn_id(self) -> int:
        txn = self._next_txn
        self._next_txn = txn + 1
        return txn

    def send(self, request: Request, timeout: float) -> asyncio.Future[Response]:
        """Send ``request`` (its txn_id must come from ``next_txn_id``); the future resolves
        with the response of any status, or fails with a BKError on timeout or disconnect."""
        future: asyncio.Future[Response] = self._loop.create_future()
        if self._closed_error is not None:
            future.set_exception(self._closed_error)
            return future
        txn_id = request.txn_id
        timer = self._loop.call_later(timeout, self._expire, txn_id, timeout)
        self._pending[txn_id] = _Pending(future, timer)
        self._out.append(encode(request))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return future

    async def call(self, request: Request, timeout: float) -> Response:
        """Send with a fresh txn_id; return the response, raising for any non-OK status."""
        request = _with_txn(request, self.next_txn_id())
        response = await self.send(request, timeout)
        if response.status is not StatusCode.EOK:
            raise status_error(response, self.address)
        return response

    def _expire(self, txn_id: int, timeout: float) -> None:
        pending = self._pending.pop(txn_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_exception(
                OperationTimeoutError(f"bookie {self.address} did not answer within {timeout}s")
            )

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._transport is None or not self._out:
            return
        out, self._out = self._out, []
        self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def drain(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if self._write_ready is not None:
            await asyncio.shield(self._write_ready)

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()
        self._fail_all(BookieUnavailableError(f"connection to bookie {self.address} closed"))

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        error = BookieUnavailableError(f"connection to bookie {self.address} lost")
        error.__cause__ = exc
        self._fail_all(error)

    def pause_writing(self) -> None:
        if self._write_ready is None:
            self._write_ready = self._loop.create_future()

    def resume_writing(self) -> None:
        ready, self._write_ready = self._write_ready, None
        if ready is not None and not ready.done():
            ready.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            self._broken(f"broken framing from bookie: {exc}")
            return
        pending = self._pending
        for payload in frames:
            try:
                response = decode_response(payload, self._max_frame)
            except MalformedMessageError as exc:
                self._broken(f"malformed response from bookie: {exc.reason}")
                return
            entry = pending.pop(response.txn_id, None)
            if entry is None:
                continue  # answered after its deadline
            entry.timer.cancel()
            if not entry.future.done():
                entry.future.set_result(response)

    def _broken(self, why: str) -> None:
        log.warning("%s: %s", self.address, why)
        if self._transport is not None:
            self._transport.abort()
        self._fail_all(BookieUnavailableError(f"{self.address}: {why}"))

    def _fail_all(self, error: BookieUnavailableError) -> None:
        if self._closed_error is None:
            self._closed_error = error
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            entry.timer.cancel()
            if not entry.future.done():
                entry.future.set_exception(error)
        self.resume_writing()


def status_error(response: Response, address: str) -> Exception:
    """The BKError for a non-OK response."""
    if isinstance(response, ErrorResponse):
        return BadRequestError(f"bookie {address} could not parse request {response.request_op}")
    return error_for_status(response.status, f"{response.status.name} from bookie {address}")


def _with_txn(request: Request, txn_id: int) -> Request:
    return dataclasses.replace(request, txn_id=txn_id)
