"""The network seam on the client side: how a connection to a bookie is opened.

Production: the running loop's ``create_connection`` (uvloop when installed). A simulator hands
in a ``Connector`` with in-memory transports. Raw ``OSError`` never leaves this layer
(STYLE 5): it becomes ``BookieUnavailableError`` with the cause chained.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

P = TypeVar("P", bound=asyncio.Protocol)


class Connector(Protocol):
    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]: ...


class AsyncioConnector:
    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(factory, host, port)
        return transport, protocol
