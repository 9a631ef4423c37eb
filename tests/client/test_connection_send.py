"""A client connection's sends: turn-end flushes, and the lone add written at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiobk.client.connection import BookieConnection


class _Transport:
    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []

    def write(self, data: bytes) -> None:
        self.writes.append([data])

    def writelines(self, data: list[bytes]) -> None:
        self.writes.append(list(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _connected() -> tuple[BookieConnection, _Transport]:
    conn = BookieConnection("127.0.0.1:1")
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def _ignore(_result: Any) -> None:
    pass


@pytest.mark.timeout(10)
async def test_sends_wait_for_the_end_of_the_turn_and_leave_together() -> None:
    conn, transport = _connected()
    conn.send_frame(1, b"a", 5.0, _ignore)
    conn.send_frame(2, b"b", 5.0, _ignore)
    assert transport.writes == []
    await asyncio.sleep(0)
    assert transport.writes == [[b"a", b"b"]]
    conn.close()


@pytest.mark.timeout(10)
async def test_a_send_now_is_written_at_once_behind_what_was_queued() -> None:
    """``now``: written before the call returns, in order behind the frames queued earlier in
    the turn; the turn's end writes none of them again."""
    conn, transport = _connected()
    conn.send_frame(1, b"lone", 5.0, _ignore, now=True)
    assert transport.writes == [[b"lone"]]
    conn.send_frame(2, b"queued", 5.0, _ignore)
    conn.send_frame(3, b"now", 5.0, _ignore, now=True)
    assert transport.writes == [[b"lone"], [b"queued", b"now"]]
    await asyncio.sleep(0)
    assert transport.writes == [[b"lone"], [b"queued", b"now"]]
    assert conn.in_flight == 3
    conn.close()
