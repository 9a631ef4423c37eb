"""A client connector over real TCP that drops chosen requests to chosen bookies (the "lost
message" of the BP-46 scenarios), leaving everything else untouched."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiobk.client.net import AsyncioConnector, P
from aiobk.protocol import FrameDecoder, Request, decode_request, frame

Rule = Callable[[str, Request], bool]


class _FilteringTransport:
    def __init__(self, inner: asyncio.Transport, address: str, owner: DroppingConnector) -> None:
        self._inner = inner
        self._address = address
        self._owner = owner
        self._decoder = FrameDecoder()

    def write(self, data: Any) -> None:
        out = []
        for payload in self._decoder.feed(bytes(data)):
            request = decode_request(payload)
            if any(rule(self._address, request) for rule in self._owner.rules):
                self._owner.dropped.append((self._address, request))
                continue
            out.append(frame(payload))
        if out:
            self._inner.write(b"".join(out))

    def writelines(self, chunks: Any) -> None:
        """The client hands over a turn's frames in one ``writelines``: each is filtered."""
        self.write(b"".join(bytes(chunk) for chunk in chunks))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class DroppingConnector:
    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self.dropped: list[tuple[str, Request]] = []

    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]:
        transport, protocol = await AsyncioConnector().connect(factory, host, port)
        wrapper = _FilteringTransport(transport, f"{host}:{port}", self)
        protocol._transport = wrapper  # type: ignore[attr-defined]  # the client's connection
        return wrapper, protocol  # type: ignore[return-value]
