"""The tests' event loop (``tests.support.loops``): a server and a connection left open at a
test's end are closed with the loop and named in a failure, never a hang."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.support.loops import new_event_loop


@pytest.mark.timeout(20)
def test_a_loop_closed_with_a_server_and_a_connection_open_closes_them_and_says_so() -> None:
    loop = new_event_loop()

    async def leave_open() -> tuple[asyncio.Server, asyncio.BaseTransport]:
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _protocol = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        return server, transport

    server, _transport = loop.run_until_complete(leave_open())
    port = server.sockets[0].getsockname()[1]
    with pytest.raises(AssertionError, match=r"the test left open at its end: .*TCPServer"):
        loop.close()
    assert loop.is_closed()
    with pytest.raises(ConnectionRefusedError):  # the listening socket is closed
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.timeout(20)
def test_a_loop_closed_with_nothing_open_closes_quietly() -> None:
    loop = new_event_loop()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    assert loop.is_closed()
