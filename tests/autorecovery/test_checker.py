"""The checker's reads (autorecovery.checker), against a fake connection: a check of a big
ledger keeps few reads in flight, and stops at the first entry found missing."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiobk.autorecovery.checker import ASKED_AT_ONCE, Holding, absent_entries, holds
from aiobk.client.pool import BookiePool
from aiobk.protocol import ReadRequest, ReadResponse, StatusCode


class _Conn:
    def __init__(self, missing: set[int]) -> None:
        self.missing = missing
        self.in_flight = self.most = self.asked = 0
        self._txn = 0

    def next_txn_id(self) -> int:
        self._txn += 1
        return self._txn

    async def send(self, request: ReadRequest, timeout: float) -> ReadResponse:
        self.in_flight += 1
        self.asked += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.001)  # a read takes a moment: concurrent reads overlap
        self.in_flight -= 1
        if request.entry_id in self.missing:
            return ReadResponse(
                request.txn_id, StatusCode.ENOENTRY, request.ledger_id, request.entry_id
            )
        return ReadResponse(
            request.txn_id, StatusCode.EOK, request.ledger_id, request.entry_id, body=b"x"
        )


class _Pool:
    def __init__(self, conn: _Conn) -> None:
        self.conn = conn

    async def get(self, bookie: str) -> _Conn:
        return self.conn


def _pool(conn: _Conn) -> BookiePool:
    return cast(BookiePool, cast(Any, _Pool(conn)))


async def test_a_check_of_every_entry_keeps_few_reads_in_flight() -> None:
    conn = _Conn(missing=set())
    assert await holds(_pool(conn), "b", 1, range(5000), 1.0) is Holding.HELD
    assert conn.asked == 5000
    assert conn.most <= ASKED_AT_ONCE


async def test_a_check_stops_soon_after_the_first_missing_entry() -> None:
    conn = _Conn(missing={100})
    assert await holds(_pool(conn), "b", 1, range(5000), 1.0) is Holding.MISSING
    assert conn.asked < 100 + 2 * ASKED_AT_ONCE


async def test_absent_entries_lists_every_missing_one_in_order() -> None:
    conn = _Conn(missing={3, 70, 71, 999})
    absent, unsure = await absent_entries(_pool(conn), "b", 1, range(1000), 1.0, 8)
    assert (absent, unsure) == ([3, 70, 71, 999], False)
    assert conn.most <= 8
