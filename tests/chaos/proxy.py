"""A fault-injecting TCP proxy on loopback, one in front of each bookie. Bookies advertise the
proxy's address, so every client and every bookie-to-bookie repair goes through it.

Modes: ``pass``; ``hold`` (a partition: bytes wait in the proxy until ``heal``, as TCP
retransmits them, and new connections are accepted but go nowhere yet); ``reset()`` aborts
every connection through it (both ends see a reset).
"""

from __future__ import annotations

import asyncio
import contextlib

from aiobk.metadata import free_port

CHUNK = 1 << 16


class Proxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port(host)
        self.target_port = target_port
        self.holding = False
        self._healed = asyncio.Event()
        self._healed.set()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def hold(self) -> None:
        self.holding = True
        self._healed.clear()

    def heal(self) -> None:
        self.holding = False
        self._healed.set()

    def reset(self) -> None:
        for client, upstream in list(self._pairs):
            for writer in (client, upstream):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(self._healed.wait(), 30)
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.target_port), 5
            )
        except (OSError, TimeoutError):
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while True:
                data = await source.read(CHUNK)
                if not data:
                    break
                if self.holding:
                    await self._healed.wait()
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError, RuntimeError):
            pass  # RuntimeError: uvloop's write to a side reset (or aborted) while held
        finally:
            self._pairs.discard(pair)
            for writer in pair:
                with contextlib.suppress(Exception):
                    writer.transport.abort()
