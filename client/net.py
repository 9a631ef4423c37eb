"""The network seam on the client side: how a connection to a bookie is opened.

Production: the running loop's ``create_connection`` (uvloop when installed). A simulator hands
in a ``Connector`` with in-memory transports. Raw ``OSError`` never leaves this layer: it
becomes ``BookieUnavailableError`` with the cause chained.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

from aiobk.protocol import (
    ErrorResponse,
    FrameDecoder,
    FrameError,
    MalformedMessageError,
    StartTlsRequest,
    StartTlsResponse,
    StatusCode,
    decode_response,
    encode,
)

STARTUP_MAX_FRAME = 4096  # the answer to START_TLS is a few bytes

P = TypeVar("P", bound=asyncio.Protocol)


class Connector(Protocol):
    """The seam through which the client opens bookie connections: the real network
    (``AsyncioConnector``), TLS on top of another connector, or a simulated network."""

    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]:
        """Open a connection to ``host:port`` driven by the protocol ``factory`` makes.

        Returns:
            The transport and the protocol.

        Raises:
            OSError: The connection could not be made (the caller translates it).
        """
        ...


class AsyncioConnector:
    """Connections through the running loop's ``create_connection`` (uvloop's when
    installed): what production uses."""

    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]:
        """Open a TCP connection (see ``Connector.connect``)."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(factory, host, port)
        return transport, protocol


class _StartTls(asyncio.Protocol):
    """A connection's first moments: ask for TLS (START_TLS) and wait for the answer."""

    def __init__(self) -> None:
        self._decoder = FrameDecoder(STARTUP_MAX_FRAME)
        self.answer: asyncio.Future[StatusCode] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(encode(StartTlsRequest(0)))

    def data_received(self, data: bytes) -> None:
        if self.answer.done():
            return
        try:
            frames = self._decoder.feed(data)
            if not frames:
                return
            if len(frames) > 1 or self._decoder.buffered:
                raise MalformedMessageError("more than one answer to START_TLS")
            response = decode_response(frames[0])
        except (FrameError, MalformedMessageError) as exc:
            self.answer.set_exception(ConnectionError(f"not a bookie's answer to START_TLS: {exc}"))
            return
        if isinstance(response, StartTlsResponse):
            self.answer.set_result(response.status)
        elif isinstance(response, ErrorResponse) and response.status is StatusCode.EBADREQ:
            self.answer.set_result(StatusCode.EBADREQ)  # a bookie from before START_TLS
        else:
            self.answer.set_exception(
                ConnectionError(f"unexpected answer to START_TLS: {response}")
            )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(ConnectionError("the bookie closed the connection"))


class TlsConnector:
    """Connections upgraded to TLS before their first request (START_TLS, as BookKeeper's
    client does), or not at all: a bookie that does not offer TLS, or whose certificate does
    not verify, fails the connection with ``ConnectionError`` (an ``OSError``); it is never
    used in plaintext. The bookie's host is the name its certificate must carry (an IP
    address matches an IP subject alternative name). ``context`` carries the client's own
    certificate, if it has one: its identity and roles on bookies with ``tls_client_auth``.
    ``context`` may be a function returning the context to use now (a bookie's own
    connections follow its certificate's reloads)."""

    def __init__(
        self,
        context: ssl.SSLContext | Callable[[], ssl.SSLContext],
        inner: Connector | None = None,
    ) -> None:
        self._context = context
        self._inner = inner or AsyncioConnector()

    @property
    def context(self) -> ssl.SSLContext:
        context = self._context
        return context if isinstance(context, ssl.SSLContext) else context()

    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]:
        transport, starter = await self._inner.connect(_StartTls, host, port)
        try:
            status = await starter.answer
            if status is not StatusCode.EOK:
                raise ConnectionError(f"bookie {host}:{port} does not offer TLS ({status.name})")
            protocol = factory()
            loop = asyncio.get_running_loop()
            tls = await loop.start_tls(transport, protocol, self.context, server_hostname=host)
        except BaseException:
            transport.abort()
            raise
        if tls is None:  # pragma: no cover - only when the transport closed meanwhile
            raise ConnectionError(f"bookie {host}:{port} closed the connection during TLS")
        protocol.connection_made(tls)  # start_tls does not: the TLS transport is the one
        return tls, protocol
