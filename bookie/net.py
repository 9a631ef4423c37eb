"""The network seam on the server side: where a bookie listens.

``AsyncioNetwork`` uses the running loop's ``create_server`` (uvloop when installed). A simulator
passes its own ``ServerNetwork`` whose transports are in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NamedTuple, Protocol


class BookieAddress(NamedTuple):
    """Where a bookie listens: ``str()`` gives ``host:port``.

    Attributes:
        host: The address it is bound to.
        port: The port (the one the system chose when the config asked for 0).
    """

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class ServerHandle(Protocol):
    @property
    def port(self) -> int: ...

    def close(self) -> None: ...

    async def start_serving(self) -> None:
        """Begin accepting connections (the socket is bound and listening before this)."""
        ...

    async def wait_closed(self) -> None: ...


class ServerNetwork(Protocol):
    async def start_server(
        self, factory: Callable[[], asyncio.Protocol], host: str, port: int
    ) -> ServerHandle: ...


class _AsyncioServer:
    def __init__(self, server: asyncio.Server) -> None:
        self._server = server

    @property
    def port(self) -> int:
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def close(self) -> None:
        self._server.close()

    async def start_serving(self) -> None:
        await self._server.start_serving()

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


class AsyncioNetwork:
    """TCP on the running event loop."""

    async def start_server(
        self, factory: Callable[[], asyncio.Protocol], host: str, port: int
    ) -> ServerHandle:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            factory, host, port, reuse_address=True, backlog=1024, start_serving=False
        )
        return _AsyncioServer(server)
