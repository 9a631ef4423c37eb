"""The client end to end on real bookies."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client import BookKeeper, Entry
from aiobk.client.errors import (
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    UnauthorizedError,
)


async def test_create_append_close_open_read(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw", custom_metadata={"app": b"x"})
        ids = await asyncio.gather(*(lh.append(b"entry-%d" % i) for i in range(100)))
        assert ids == list(range(100))
        assert lh.last_add_confirmed == 99
        await lh.close()
        await lh.close()  # idempotent
        with pytest.raises(LedgerClosedError):
            await lh.append(b"late")
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.is_closed
        assert rh.last_add_confirmed == 99
        entries = await rh.read(0, 99)
        assert entries[7] == Entry(lh.ledger_id, 7, b"entry-7")
        assert rh.metadata.custom_metadata["app"] == b"x"
        assert rh.metadata.length == sum(len(b"entry-%d" % i) for i in range(100))
        with pytest.raises(NoSuchEntryError):
            await rh.read(99, 100)
        with pytest.raises(UnauthorizedError):
            await bk.open_ledger(lh.ledger_id, password=b"wrong")
        assert [i async for i in bk.list_ledgers()] == [lh.ledger_id]


async def test_recovery_closes_an_abandoned_ledger(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as writer_bk:
        lh = await writer_bk.create_ledger(3, 3, 2)
        for i in range(10):
            await lh.append(b"%d" % i)
        async with await BookKeeper.connect(cluster.uri) as reader_bk:
            rh = await reader_bk.open_ledger(lh.ledger_id)
            assert rh.is_closed
            assert rh.metadata.last_entry_id == 9
            assert [e.data for e in await rh.read(0, 9)] == [b"%d" % i for i in range(10)]
        with pytest.raises(LedgerFencedError):
            await lh.append(b"after fence")
