"""A connection's TLS and access state: START_TLS and the upgrade it starts, and the checks a
guarded connection's requests pass before their handler (``bookie.access``).

What the peer proved -- a handshake with our protocol version, a TLS session, the verified
certificate's name and roles -- is kept here, beside the one request that changes it and the
checks that read it, so the connection (``bookie.connection``) deals in frames and replies only.
START_TLS swaps the connection's transport: the answer goes out in plaintext, behind every
earlier answer, then the socket is handed to TLS and the peer starts its handshake.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

from aiobk.bookie.access import Policy, Refusal, check, roles_of, subject_name
from aiobk.bookie.context import BookieContext
from aiobk.bookie.tls import BookieTls
from aiobk.protocol import (
    MIN_PROTOCOL_VERSION,
    NO_ROLES,
    PROTOCOL_VERSION,
    ErrorResponse,
    FrameDecoder,
    HandshakeRequest,
    OpCode,
    Request,
    Response,
    StartTlsResponse,
    StatusCode,
    encode,
)

log = logging.getLogger(__name__)

TLS_HANDSHAKE_TIMEOUT = 10.0  # seconds a peer has to finish the TLS handshake


class Upgradable(Protocol):
    """What START_TLS reads and does of its connection (``bookie.connection.ServerConnection``,
    also the asyncio protocol the TLS transport delivers to): the transport it swaps, the
    reading it stops and starts again, and the closing a refusal or a failed handshake brings."""

    ctx: BookieContext
    peer: str
    transport: asyncio.Transport | None
    closed: bool
    read_paused: bool

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def update_reading(self) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...

    def reject(self, why: str) -> None: ...

    def close(self) -> None: ...


class StartTls:
    def __init__(
        self,
        conn: Upgradable,
        tls: BookieTls | None,
        policy: Policy,
        *,
        decoder: FrameDecoder,
        backlog: deque[bytes],
        send: Callable[[Response], None],
        flush: Callable[[], None],
    ) -> None:
        # Weak: the connection holds this part, and a cycle would keep a dropped connection,
        # its partial frame and tasks until the garbage collector runs instead of freeing them
        # the moment the last reference goes.
        self._conn = weakref.ref(conn)
        self._tls = tls
        self._policy = policy
        self._decoder = decoder  # a partial frame behind START_TLS: a breach
        self._backlog = backlog  # so are whole requests read and not handled yet
        self._send = send  # queues an answer behind the earlier ones
        self._flush = flush  # writes the queued answers now
        self._loop = asyncio.get_running_loop()
        self.guarded = policy.guarded
        self.tls_active = False  # upgraded by START_TLS
        self.upgrading = False  # START_TLS answered, the TLS handshake not done yet
        self.handshaken = False  # a HANDSHAKE with our protocol version was read
        self.identity = ""  # the verified client certificate's common name
        self.roles: frozenset[str] = NO_ROLES  # set by the TLS handshake (client certificate)

    def _connection(self) -> Upgradable:
        conn = self._conn()
        assert conn is not None  # called by the connection, or by a task it keeps
        return conn

    def admit(self, request: Request) -> bool:
        """Whether ``request`` goes on to its handler: START_TLS is handled here, and a guarded
        connection's requests are checked first (``bookie.access``)."""
        op = request.op
        if op is OpCode.START_TLS:
            self._start_tls(request.txn_id)
            return False
        refusal = check(
            self._policy, op, tls=self.tls_active, handshaken=self.handshaken, roles=self.roles
        )
        if refusal is not None:
            self._refuse(request, refusal)
            return False
        if op is OpCode.HANDSHAKE:
            assert isinstance(request, HandshakeRequest)
            self.handshaken = MIN_PROTOCOL_VERSION <= request.protocol_version <= PROTOCOL_VERSION
        return True

    def _refuse(self, request: Request, refusal: Refusal) -> None:
        conn = self._connection()
        conn.ctx.stats.permission_denials += 1
        who = f"{conn.peer} ({self.identity})" if self.identity else conn.peer
        (log.warning if refusal.close else log.debug)(
            "refused %s from %s: %s", request.op.name, who, refusal.why
        )
        self._send(ErrorResponse(request.txn_id, StatusCode.EPERM, request.op))
        if refusal.close:
            conn.close()

    def _start_tls(self, txn_id: int) -> None:
        """Answer START_TLS and upgrade: the answer goes out in plaintext, behind every earlier
        answer, then the socket is handed to TLS (the peer starts its handshake on reading it)."""
        conn = self._connection()
        tls, transport = self._tls, conn.transport
        if tls is None or self.tls_active or transport is None:
            self._send(StartTlsResponse(txn_id, StatusCode.EBADREQ))
            return
        if self._backlog or self._decoder.buffered:
            conn.reject("bytes sent behind START_TLS before its answer")
            return
        self.upgrading = True
        self._flush()
        transport.pause_reading()  # nothing more is read in plaintext
        conn.read_paused = True
        transport.write(encode(StartTlsResponse(txn_id, StatusCode.EOK)))
        conn.spawn(self._upgrade(transport, tls.server))

    async def _upgrade(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        conn = self._connection()
        try:
            upgraded = await self._loop.start_tls(
                raw,
                cast(asyncio.BaseProtocol, conn),  # the connection is the transport's protocol
                context,
                server_side=True,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT,
            )
            if upgraded is None:
                raise ConnectionError("the connection closed during the TLS handshake")
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raw.abort()
            if not conn.closed:  # the TLS layer never told us it was up: it may not tell
                conn.connection_lost(exc)  # us it went down either
        except asyncio.CancelledError:
            raw.abort()
            raise
        else:
            # start_tls does not call connection_made: the upgraded transport is ours to take.
            self._upgraded(upgraded)

    def upgrade_failed(self, exc: BaseException | None) -> None:
        conn = self._connection()
        self.upgrading = False
        conn.ctx.stats.tls_handshake_failures += 1
        log.warning("TLS handshake with %s failed: %s", conn.peer, exc or "connection closed")

    def _upgraded(self, transport: asyncio.Transport) -> None:
        """The TLS handshake is done: requests now come and go through ``transport``."""
        conn = self._connection()
        self.upgrading = False
        conn.transport = transport
        self.tls_active = True
        conn.ctx.stats.tls_handshakes += 1
        cert = transport.get_extra_info("peercert")
        self.identity = subject_name(cert)
        if self._policy.client_auth:
            self.roles = roles_of(cert)
        config = conn.ctx.config
        transport.set_write_buffer_limits(
            high=config.server_write_buffer_high_water_mark,
            low=config.server_write_buffer_low_water_mark,
        )
        conn.read_paused = False  # the TLS transport reads from the start
        conn.update_reading()
