"""One client connection: a thin loop around the codec (STYLE 2).

Bytes in -> ``FrameDecoder`` -> ``decode_request`` -> the operation's handler. Handlers answer
through ``reply``; responses queue up and go out in one write per event-loop turn, so the acks
of a whole journal batch leave in one syscall. A connection that sends a frame over the limit,
or bytes that are not a message, is closed; a request that parses far enough to have a txn_id
but is invalid gets EBADREQ and the connection carries on. Either way only this peer is hit.

Backpressure: past ``max_inflight_per_connection`` unanswered requests, or while the socket's
send buffer is full, the connection stops reading from its peer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from protocol import (
    ErrorResponse,
    FrameDecoder,
    FrameError,
    MalformedMessageError,
    Response,
    StatusCode,
    decode_request,
    encode,
)

if TYPE_CHECKING:
    from bookie.server import Bookie

log = logging.getLogger(__name__)


class ServerConnection(asyncio.Protocol):
    def __init__(self, bookie: Bookie) -> None:
        self.bookie = bookie
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._decoder = FrameDecoder(bookie.config.max_frame_size)
        self._max_frame = bookie.config.max_frame_size
        self._max_inflight = bookie.config.max_inflight_per_connection
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._inflight = 0
        self._read_paused = False
        self._write_paused = False
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()

    # -------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.bookie.connections.add(self)
        self.bookie.stats.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.bookie.connections.discard(self)
        for task in self.tasks:
            task.cancel()
        self._out.clear()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            self._reject(f"broken framing ({exc})")
            return
        handlers = self.bookie.handlers
        for payload in frames:
            try:
                request = decode_request(payload, self._max_frame)
            except MalformedMessageError as exc:
                self.bookie.stats.bad_requests += 1
                if exc.txn_id is None:
                    self._reject(f"undecodable request ({exc.reason})")
                    return
                log.debug("bad request from %s: %s", self.peer, exc.reason)
                self._send(ErrorResponse(exc.txn_id, StatusCode.EBADREQ, exc.op or 0))
                continue
            self._inflight += 1
            handlers[request.op](self.bookie, request, self)
            if self.closed:
                return
        self.bookie.journal.flush_idle()
        if self._inflight >= self._max_inflight:
            self._update_reading()

    # -------------------------------------------------------------- for handlers

    def reply(self, response: Response) -> None:
        """Answer one request (every handled request gets exactly one reply)."""
        self._inflight -= 1
        if self._read_paused and self._inflight < self._max_inflight // 2:
            self._update_reading()
        self._send(response)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run an asynchronous handler; it is cancelled if the connection goes away."""
        task = self._loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -------------------------------------------------------------- internals

    def _send(self, response: Response) -> None:
        if self.closed:
            return
        if self.bookie.journal.urgent and not self._out and self.transport is not None:
            self.transport.write(encode(response))  # an idle add: no need to wait a loop turn
            return
        self._out.append(encode(response))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or not self._out or self.transport is None:
            return
        out, self._out = self._out, []
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        want_pause = self._write_paused or self._inflight >= self._max_inflight
        if want_pause and not self._read_paused:
            transport.pause_reading()
            self._read_paused = True
        elif not want_pause and self._read_paused:
            transport.resume_reading()
            self._read_paused = False

    def _reject(self, why: str) -> None:
        self.bookie.stats.bad_requests += 1
        log.warning("closing connection from %s: %s", self.peer, why)
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()
        self.closed = True

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
