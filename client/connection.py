"""One pipelined connection to one bookie.

In-flight requests live in ``dict[txn_id, (deadline, callback)]``; responses may
arrive in any order. Requests queued in one event-loop turn leave in one ``writelines`` (one
writev under uvloop), which keeps a reference to each frame rather than copying: an add's frame
goes to every bookie of its write set as the same bytes object, so while bookies are slow to read,
the client holds it once, not once per bookie (a joined write copied it into each). Every request
has a deadline, enforced by one sweep timer per connection rather than a timer per request:
past it the callback gets ``OperationTimeoutError`` and a late answer is dropped. When the
connection closes every pending request fails with ``BookieUnavailableError`` chaining the
cause, and the connection is finished: its owner opens a new one.

``txn_ids`` may be shared by many connections so that one encoded frame (an add) can go to
every bookie of a write set unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import cast

from aiobk.client.net import AsyncioConnector, Connector
from aiobk.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    ErrorResponse,
    FrameDecoder,
    FrameError,
    HandshakeRequest,
    HandshakeResponse,
    MalformedMessageError,
    OpCode,
    Request,
    Response,
    StatusCode,
    decode_response,
    encode,
)
from aiobk.protocol.errors import (
    BadRequestError,
    BKError,
    BookieUnavailableError,
    OperationTimeoutError,
    PermissionDeniedError,
    error_for_status,
)

log = logging.getLogger(__name__)

Callback = Callable[[Response | BKError], None]
SWEEP_INTERVAL = 0.05  # seconds between deadline checks


class BookieConnection(asyncio.Protocol):
    """One pipelined connection to one bookie: requests in a ``txn_id -> callback`` table
    with deadlines, answered in any order, writes coalesced per event-loop turn.

    The client keeps one per bookie (its pool opens them with ``open``); a tool that talks
    to a single bookie may use one directly. A lost connection fails every request in flight
    with ``BookieUnavailableError``, its cause chained; a request unanswered by its deadline
    fails with ``OperationTimeoutError``.

    Attributes:
        address: The ``host:port`` dialled.
        bookie_id: The bookie's id, as its handshake gave it.
        protocol_version: The protocol version agreed at the handshake.
    """

    def __init__(
        self,
        address: str,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        txn_ids: Iterator[int] | None = None,
    ) -> None:
        self.address = address
        self.bookie_id = ""
        # Agreed at the handshake: 2 and up take ADD_BATCH.
        self.protocol_version = MIN_PROTOCOL_VERSION
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder(max_frame_size)
        self._max_frame = max_frame_size
        self._pending: dict[int, tuple[float, Callback]] = {}
        # txn ids in the order sent, one queue per timeout: deadlines in a queue only grow,
        # so a sweep looks at the head of each and stops at the first that is still due
        # (answered ones leave from the head as it reaches them): O(1) per request, where a
        # scan of every pending request every SWEEP_INTERVAL cost 5% of the client's CPU at
        # 512 appends in flight.
        self._by_timeout: dict[float, deque[int]] = {}
        self._txn_ids = txn_ids if txn_ids is not None else itertools.count(1)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._sweeper: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._closed_error: BookieUnavailableError | None = None

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
        txn_ids: Iterator[int] | None = None,
    ) -> BookieConnection:
        """Connect to a bookie and agree a protocol version with it.

        Args:
            host: The bookie's host.
            port: Its port.
            timeout: Seconds for the connection and the handshake together.
            connector: How to open the transport (``AsyncioConnector`` by default).
            expected_bookie_id: Refuse a bookie that answers under another id.
            max_frame_size: The largest response frame accepted.
            client_name: Sent in the handshake (the bookie logs it).
            txn_ids: Where request ids come from (default: 1, 2, ...).

        Returns:
            The open connection.

        Raises:
            BookieUnavailableError: It could not connect, or the bookie is not the one
                expected.
        """
        address = f"{host}:{port}"
        connector = connector or AsyncioConnector()
        try:
            async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel (3.11)
                _transport, conn = await connector.connect(
                    lambda: cls(address, max_frame_size, txn_ids), host, port
                )
        except (TimeoutError, OSError) as exc:
            raise BookieUnavailableError(f"cannot connect to bookie {address}: {exc}") from exc
        try:
            hello = await conn._handshake(client_name, timeout)
        except BaseException:
            conn.close()
            raise
        if expected_bookie_id is not None and hello.bookie_id != expected_bookie_id:
            conn.close()
            raise BookieUnavailableError(
                f"{address} is bookie {hello.bookie_id!r}, not {expected_bookie_id!r}"
            )
        conn.bookie_id = hello.bookie_id
        conn.protocol_version = hello.protocol_version
        return conn

    async def _handshake(self, client_name: str, timeout: float) -> HandshakeResponse:
        """Ask for our newest protocol version; a bookie of an older release refuses it
        (EBADVERSION) naming its own, and is asked again for that one if we speak it."""
        version = PROTOCOL_VERSION
        for _attempt in range(2):
            request = HandshakeRequest(self.next_txn_id(), version, client_name)
            hello = await self.send(request, timeout)
            if not isinstance(hello, HandshakeResponse):
                break
            if hello.status is StatusCode.EOK:
                return hello
            older = hello.protocol_version
            if hello.status is not StatusCode.EBADVERSION or not (
                MIN_PROTOCOL_VERSION <= older < version
            ):
                break
            version = older
        raise status_error(hello, self.address)

    # ------------------------------------------------------------------ requests

    @property
    def closed(self) -> bool:
        """Whether the connection is closed or lost (every later request fails at once)."""
        return self._closed_error is not None

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._pending)

    def next_txn_id(self) -> int:
        """A fresh request id for this connection."""
        return next(self._txn_ids)

    def send_frame(
        self,
        txn_id: int,
        frame: bytes,
        timeout: float,
        callback: Callback,
        now: bool = False,
        tail: bytes = b"",
    ) -> None:
        """Send an encoded request; ``callback`` gets the response (any status) or a BKError.
        ``now``: write it at once (with anything queued before it) instead of at the end of
        the loop turn -- a lone add, which nothing would join. ``tail``: the rest of the
        frame, written after ``frame`` as it is (``codec.encode_parts``)."""
        if self._closed_error is not None:
            self._loop.call_soon(callback, self._closed_error)
            return
        self._pending[txn_id] = (self._loop.time() + timeout, callback)
        queue = self._by_timeout.get(timeout)
        if queue is None:
            queue = self._by_timeout[timeout] = deque()
        queue.append(txn_id)
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(SWEEP_INTERVAL, self._sweep)
        self._out.append(frame)
        if tail:
            self._out.append(tail)
        if now:
            # Written here: no turn-end flush is scheduled for it (one callback less on the
            # loop per bookie per lone add, run before the loop can wait for the answers).
            self._flush()
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send_request(self, request: Request, timeout: float, callback: Callback) -> None:
        """Encode and send ``request``; ``callback`` gets its response or a BKError."""
        self.send_frame(request.txn_id, encode(request), timeout, callback)

    def send(self, request: Request, timeout: float) -> asyncio.Future[Response]:
        """Send ``request`` (txn_id from ``next_txn_id``); the future resolves with the response
        of any status, or fails with a BKError on timeout or disconnect."""
        future: asyncio.Future[Response] = self._loop.create_future()

        def done(result: Response | BKError) -> None:
            if future.done():
                return
            if isinstance(result, BKError):
                future.set_exception(result)
            else:
                future.set_result(result)

        self.send_request(request, timeout, done)
        return future

    async def call(self, request: Request, timeout: float) -> Response:
        """Send with a fresh txn_id; return the response, raising for any non-OK status."""
        request = dataclasses.replace(request, txn_id=self.next_txn_id())
        response = await self.send(request, timeout)
        if response.status is not StatusCode.EOK:
            raise status_error(response, self.address)
        return response

    def _sweep(self) -> None:
        self._sweeper = None
        now = self._loop.time()
        pending = self._pending
        expired = []
        for timeout, queue in list(self._by_timeout.items()):
            while queue:
                entry = pending.get(queue[0])
                if entry is not None and entry[0] > now:
                    break  # the rest of this queue is due later still
                txn = queue.popleft()
                if entry is not None:
                    expired.append(txn)
            if not queue:
                del self._by_timeout[timeout]
        for txn in expired:
            # A callback may close the connection, which fails (and removes) the rest.
            entry = pending.pop(txn, None)
            if entry is not None:
                entry[1](OperationTimeoutError(f"bookie {self.address} did not answer in time"))
        if self._pending and self._closed_error is None:
            self._sweeper = self._loop.call_later(SWEEP_INTERVAL, self._sweep)
        elif not self._pending:
            self._by_timeout.clear()  # only answered ones were left in them

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._transport is None or not self._out:
            return
        if self._closed_error is not None or self._transport.is_closing():
            # Lost meanwhile (uvloop raises on a write to a closed transport); the pending
            # requests have failed with the connection already.
            self._out.clear()
            return
        out, self._out = self._out, []
        if len(out) == 1:
            self._transport.write(out[0])
        else:
            self._transport.writelines(out)

    def close(self) -> None:
        """Send what is queued, close, and fail every request in flight."""
        if self._transport is not None:
            self._flush()
            self._transport.close()
        self._fail_all(BookieUnavailableError(f"connection to bookie {self.address} closed"))

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """asyncio's callback: the transport is ready."""
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        """asyncio's callback: fail every request in flight, ``exc`` as the cause."""
        error = BookieUnavailableError(f"connection to bookie {self.address} lost")
        error.__cause__ = exc
        self._fail_all(error)

    def data_received(self, data: bytes) -> None:
        """asyncio's callback: decode the frames and answer their requests."""
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
            if entry is not None:  # None: answered after its deadline
                entry[1](response)

    def _broken(self, why: str) -> None:
        log.warning("%s: %s", self.address, why)
        if self._transport is not None:
            self._transport.abort()
        self._fail_all(BookieUnavailableError(f"{self.address}: {why}"))

    def _fail_all(self, error: BookieUnavailableError) -> None:
        if self._closed_error is None:
            self._closed_error = error
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        pending, self._pending = self._pending, {}
        self._by_timeout = {}
        for _deadline, callback in pending.values():
            callback(error)


def status_error(response: Response, address: str) -> BKError:
    """The BKError for a non-OK response."""
    if isinstance(response, ErrorResponse):
        if response.status is StatusCode.EPERM:
            op = response.request_op
            name = OpCode(op).name if op in OpCode._value2member_map_ else str(op)
            return PermissionDeniedError(
                f"bookie {address} refused {name}: it needs TLS "
                "(--tls-ca/--tls-cert/--tls-key), a handshake first, or a certificate with "
                "another role"
            )
        return BadRequestError(f"bookie {address} could not parse request {response.request_op}")
    return error_for_status(response.status, f"{response.status.name} from bookie {address}")
