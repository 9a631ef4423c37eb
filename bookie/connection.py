"""One client connection: a thin loop around the codec.

Bytes in -> ``FrameDecoder`` -> ``decode_request`` + ``check_request`` -> the operation's
handler. Handlers answer through ``reply``; responses queue up and go out in one write per
event-loop turn, so the acks of a whole journal batch leave in one syscall. A connection that
sends a frame over the limit, or bytes that are not a message, is closed; a request that parses
far enough to have a txn_id but is invalid gets EBADREQ and the connection carries on. Either
way only this peer is hit. START_TLS, and the checks a guarded connection's requests pass
first, are ``StartTls``'s (``bookie.starttls``); the replies queued and their writes are
``_Replies``'s.

Backpressure (``bookie.flow``): the connection stops reading from its peer while it has
``max_inflight_per_connection`` unanswered requests, while its unsent responses are above the
write buffer's high-water mark, or while the bookie has too many add bytes unanswered. What it
holds (a partial frame, unsent responses) is reported to the bookie-wide ``FlowControl``.
Long polls that wait do not count as in flight: they have their own caps, and a peer at them
must be told ETOOMANYREQUESTS at once, not stop being read until its polls time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, cast

from aiobk.bookie.access import OPEN, Policy
from aiobk.bookie.context import BookieContext, Handler, Poll
from aiobk.bookie.flow import FRAMES_PER_TURN, READS_PER_CONNECTION, FifoGate
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.bookie.starttls import StartTls
from aiobk.bookie.tls import BookieTls
from aiobk.protocol import (
    ErrorResponse,
    FrameDecoder,
    FrameError,
    MalformedMessageError,
    OpCode,
    Response,
    StatusCode,
    check_request,
    decode_request,
    encode,
)
from aiobk.tasks import TaskKeeper

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectionHooks:
    """What the server wires into every connection (the journal's group commit, today)."""

    # Every request read in this turn has been handed over: the journal may write an idle
    # add's record now instead of a loop turn later (``Journal.flush_idle``).
    batch_done: Callable[[], object]
    # Replies made now should be written at once, not queued for the end of the turn.
    answer_at_once: Callable[[], bool]
    # TLS: the bookie's contexts, and what its settings ask of every connection.
    tls: BookieTls | None = None
    policy: Policy = OPEN


class _Replies:
    """A connection's answers not written yet: queued and written in one write when the loop
    turn ends, at once when the journal asks (an idle add) or when they reach the write
    buffer's high-water mark."""

    def __init__(
        self,
        conn: ServerConnection,
        high_water: int,
        answer_at_once: Callable[[], bool],
    ) -> None:
        # Weak, as ``StartTls``'s: a cycle would keep a dropped connection and what it holds
        # until the garbage collector runs.
        self._conn = weakref.ref(conn)
        self._high_water = high_water
        self._answer_at_once = answer_at_once
        self._loop = asyncio.get_running_loop()
        self.out: list[bytes] = []
        self.out_bytes = 0
        self._flush_scheduled = False

    def send(self, response: Response) -> None:
        conn = self._conn()
        if conn is None or conn.closed:
            return
        if not self.out and self._answer_at_once() and conn.transport is not None:
            conn.transport.write(encode(response))  # an idle add: no need to wait a loop turn
            return
        frame = encode(response)
        self.out.append(frame)
        self.out_bytes += len(frame)
        if self.out_bytes >= self._high_water:
            # Hand them to the transport now, not next turn: reads that need no I/O (an entry
            # still in the entry log's write buffer) all answer within one turn, and queued
            # here they are out of the high-water mark's sight -- 1,000 pipelined reads of a
            # 1 MiB entry held 1 GiB before the first flush. Written, they pause this peer's
            # reads (``pause_writing``) once above the mark.
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        conn = self._conn()
        if conn is None or conn.closed or not self.out or conn.transport is None:
            return
        out, self.out = self.out, []
        self.out_bytes = 0
        conn.transport.write(out[0] if len(out) == 1 else b"".join(out))
        conn.measure()

    def clear(self) -> None:
        """The connection is gone: what was not written never will be."""
        self.out.clear()
        self.out_bytes = 0


class ServerConnection(asyncio.Protocol):
    def __init__(
        self, ctx: BookieContext, handlers: Mapping[OpCode, Handler], hooks: ConnectionHooks
    ) -> None:
        self.ctx = ctx
        self.flow = ctx.flow
        self._handlers = handlers
        self._batch_done = hooks.batch_done
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        config = ctx.config
        self._decoder = FrameDecoder(config.max_frame_size)
        self._max_frame = config.max_frame_size
        self._max_inflight = config.max_inflight_per_connection
        self._replies = _Replies(
            self, config.server_write_buffer_high_water_mark, hooks.answer_at_once
        )
        self._inflight = 0
        self.read_paused = False
        self._write_paused = False
        self.closed = False
        # Ordered (a TaskKeeper, dicts), not sets, here and wherever the bookie or client
        # iterates what it keeps: a set of objects iterates in the order of their addresses,
        # which differ from run to run, and the order of cancels and wake-ups is the order of
        # what follows (the simulator replays a seed exactly only if that order is the same).
        self.tasks = TaskKeeper()
        self._loop = asyncio.get_running_loop()
        self.held = 0  # bytes held, as last reported to FlowControl
        self.last_active = self._loop.time()
        self.frame_started: float | None = None  # when the partial frame held began
        self.write_paused_since: float | None = None  # responses unsendable since
        self.reads = FifoGate(READS_PER_CONNECTION)
        self.polls: dict[Poll, None] = {}  # this peer's long polls waiting now
        self._backlog: deque[bytes] = deque()  # requests read, not handled yet
        self._backlog_bytes = 0
        self._drain_scheduled = False
        # What the peer proved (handshake, TLS, certificate) and the checks that read it.
        self.starttls = StartTls(
            self,
            hooks.tls,
            hooks.policy,
            decoder=self._decoder,
            backlog=self._backlog,
            send=self._replies.send,
            flush=self._replies.flush,
        )

    # -------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        config = self.ctx.config
        self.transport.set_write_buffer_limits(
            high=config.server_write_buffer_high_water_mark,
            low=config.server_write_buffer_low_water_mark,
        )
        if self.flow.stopped:  # accepted as the bookie stopped: nothing would serve it
            self.closed = True
            self.transport.abort()
            return
        if not self.flow.admit(self):
            log.warning("refusing a connection from %s: max_connections reached", self.peer)
            self.closed = True
            self.transport.abort()
            return
        self.ctx.stats.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        # The TLS handshake failed (the upgrade task is cancelled below).
        if self.starttls.upgrading:
            self.starttls.upgrade_failed(exc)
        self.closed = True
        self.flow.forget(self)
        self.tasks.cancel()
        for poll in list(self.polls):
            poll.cancel()
        self._replies.clear()
        self._backlog.clear()
        self._backlog_bytes = 0

    def pause_writing(self) -> None:
        self._write_paused = True
        self.write_paused_since = self._loop.time()
        self.reads.set_open(False)
        self.update_reading()
        self.measure()

    def resume_writing(self) -> None:
        self._write_paused = False
        self.write_paused_since = None
        self.reads.set_open(True)
        self.update_reading()
        self.measure()

    def data_received(self, data: bytes) -> None:
        self.last_active = self._loop.time()
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            self.reject(f"broken framing ({exc})")
            return
        if not self._decoder.buffered:
            self.frame_started = None
        elif self.frame_started is None or frames:
            self.frame_started = self.last_active  # a new frame began in this chunk
        if frames:
            self._backlog.extend(frames)
            self._backlog_bytes += sum(map(len, frames))
            if not self._drain_scheduled:
                self._handle_backlog()  # measures what is held when done
                return
        self.measure()  # a partial frame grew: it counts against max_connection_memory

    def _handle_backlog(self) -> None:
        """Handle up to ``FRAMES_PER_TURN`` requests; the rest wait for the next loop turn,
        with reading paused meanwhile. One peer's burst -- 100,000 long polls over twenty
        connections, all read in one turn -- otherwise made every other peer wait for all of
        it: a plain read took 3.6 s."""
        self._drain_scheduled = False
        backlog = self._backlog
        handlers = self._handlers
        starttls = self.starttls
        ctx = self.ctx
        budget = FRAMES_PER_TURN  # requests; an ADD_BATCH counts each of its entries
        while backlog and budget > 0:
            budget -= 1
            if self.closed:
                return
            if self._stalled():
                break  # the rest stay frames (bytes) until there is room: ``update_reading``
            payload = backlog.popleft()
            self._backlog_bytes -= len(payload)
            try:
                request = decode_request(payload, self._max_frame)
                check_request(request)  # nothing storage cannot hold is ever acknowledged
            except MalformedMessageError as exc:
                self.ctx.stats.bad_requests += 1
                if exc.txn_id is None:
                    self.reject(f"undecodable request ({exc.reason})")
                    return
                log.debug("bad request from %s: %s", self.peer, exc.reason)
                self._replies.send(ErrorResponse(exc.txn_id, StatusCode.EBADREQ, exc.op or 0))
                continue
            if (starttls.guarded or request.op is OpCode.START_TLS) and not starttls.admit(request):
                if self.closed or starttls.upgrading:
                    return
                continue
            self._inflight += 1
            try:
                work = handlers[request.op](ctx, request, self)
                if work is not None:
                    budget -= work - 1
            except IndexCorruptError as exc:  # a damaged index block: EIO, never a guess
                ctx.stats.corrupt_reads += 1
                log.error("bookie %s: %s", ctx.admin.bookie_id, exc)
                self.reply(ErrorResponse(request.txn_id, StatusCode.EIO, request.op))
        if self.closed:
            return
        self._batch_done()
        self.measure()
        if backlog and not self._drain_scheduled and not self._stalled():
            self._drain_scheduled = True
            self._loop.call_soon(self._handle_backlog)
        if backlog or self.read_paused or self._busy() or self.flow.adds_paused:
            self.update_reading()

    def _stalled(self) -> bool:
        """No room for more requests now: the bookie is over ``max_add_bytes_in_progress`` or
        this peer has as many in flight as it may. Frames already read wait as they are: an
        add handled holds about 1,240 bytes of objects (``flow.ADD_HELD_BYTES``), its frame a
        few dozen, and one read from the socket can bring thousands of small adds."""
        return self.flow.adds_paused or self._busy()

    # -------------------------------------------------------------- for handlers

    @property
    def roles(self) -> frozenset[str]:
        """The peer's roles, from its verified client certificate (``StartTls``)."""
        return self.starttls.roles

    @property
    def origin(self) -> object:
        return self

    def reply(self, response: Response) -> None:
        """Answer one request (every handled request gets exactly one reply)."""
        self._inflight -= 1
        if self.read_paused and self._inflight - len(self.polls) < self._max_inflight // 2:
            self.update_reading()
        self._replies.send(response)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run an asynchronous handler; it is cancelled if the connection goes away."""
        self.tasks.spawn(coro)

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """Hold a turn to fetch an entry for this peer: a place among its few concurrent reads
        (none while its unsent responses are above the high-water mark) and among the
        bookie's. Reply inside the block, so the entry is counted as queued when the turn ends.
        """
        await self.reads.acquire()
        try:
            async with self.flow.reads:
                yield
        finally:
            self.reads.release()

    @property
    def long_polls(self) -> int:
        """Long polls of this peer waiting now."""
        return len(self.polls)

    def poll_started(self, poll: Poll) -> None:
        # A waiting long poll leaves the in-flight count that may have paused this peer: look
        # again. Before, a connection with max_inflight_per_connection polls waiting was not
        # read until they expired, so its next requests -- more polls past the cap, a plain
        # read -- were answered a whole poll timeout late (50,000 polls of 8 s on one
        # connection came back 24 s late).
        self.polls[poll] = None
        if self.read_paused:
            self.update_reading()

    def poll_ended(self, poll: Poll) -> None:
        self.polls.pop(poll, None)
        if self.read_paused:
            self.update_reading()

    def _busy(self) -> bool:
        """As many requests in flight as the peer may have, waiting long polls aside."""
        return self._inflight - len(self.polls) >= self._max_inflight

    @property
    def idle(self) -> bool:
        """Nothing in flight and no partial frame: closing it loses nothing."""
        return self._inflight == 0 and self.frame_started is None and not self._backlog

    def held_now(self) -> int:
        """Bytes this connection holds: a partial frame and responses not yet sent."""
        if self.closed or self.transport is None:
            return 0
        return (
            self._decoder.buffered
            + self._backlog_bytes
            + self._replies.out_bytes
            + self.transport.get_write_buffer_size()
        )

    def measure(self) -> None:
        """Report what this connection holds now to the bookie-wide count."""
        self.flow.note_held(self, self.held_now())

    def drop(self, why: str, quiet: bool = False) -> None:
        """Close this connection at once (flow control: a bound was passed)."""
        if self.closed:
            return
        (log.debug if quiet else log.warning)("closing connection from %s: %s", self.peer, why)
        self.abort()

    # -------------------------------------------------------------- internals

    def update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        want_pause = (
            self._write_paused or self._busy() or self.flow.adds_paused or bool(self._backlog)
        )
        if want_pause and not self.read_paused:
            transport.pause_reading()
            self.read_paused = True
        elif not want_pause and self.read_paused:
            transport.resume_reading()
            self.read_paused = False
        if self._backlog and not self._drain_scheduled and not self._stalled():
            self._drain_scheduled = True  # frames held while stalled: their turn comes again
            self._loop.call_soon(self._handle_backlog)

    def reject(self, why: str) -> None:
        self.ctx.stats.bad_requests += 1
        log.warning("closing connection from %s: %s", self.peer, why)
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._replies.flush()
            self.transport.close()
        self.closed = True
        self.flow.forget(self)

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
        self.flow.forget(self)
