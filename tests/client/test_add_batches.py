"""Appends in flight leave in ADD_BATCHes (protocol 2), and a bookie of protocol 1
gets them one ADD each: the same entries, in the same order, either way."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.bookie.ops import admin
from aiobk.client import BookKeeper
from aiobk.protocol import Durability

APPENDS = 2_000


async def _append_all(bk: BookKeeper, e: int, wq: int, aq: int, durability: Durability) -> None:
    lh = await bk.create_ledger(e, wq, aq, durability=durability)
    ids = await asyncio.gather(*(lh.append(b"entry-%d" % i) for i in range(APPENDS)))
    assert ids == list(range(APPENDS))
    await lh.close()
    rh = await bk.open_ledger(lh.ledger_id)
    got = [entry.data for entry in await rh.read(0, APPENDS - 1)]
    assert got == [b"entry-%d" % i for i in range(APPENDS)]


@pytest.mark.parametrize(
    ("ensemble", "durability"),
    [((5, 3, 2), Durability.PERSISTENT), ((3, 3, 2), Durability.VOLATILE)],
    ids=["striped-persistent", "volatile"],
)
async def test_appends_in_flight_leave_in_batches(
    cluster, ensemble: tuple[int, int, int], durability: Durability
) -> None:
    """Striped (E5 WQ3: each bookie's batch skips the entries it does not hold) and BP-14."""
    while len(cluster.bookies) < ensemble[0]:
        await cluster.add_bookie()
    async with await BookKeeper.connect(cluster.uri) as bk:
        await _append_all(bk, *ensemble, durability)
    adds = sum(b.stats.adds for b in cluster.bookies)
    batches = sum(b.stats.add_batches for b in cluster.bookies)
    assert adds == APPENDS * ensemble[1]
    assert 0 < batches < adds / 4, (batches, adds)


async def test_a_bookie_of_protocol_1_gets_one_add_each(cluster, monkeypatch) -> None:
    """Bookies whose handshake speaks protocol 1 only, as an older release's does: the client
    is refused protocol 2, asks again for 1, and sends single ADDs."""
    monkeypatch.setattr(admin, "PROTOCOL_VERSION", 1)
    async with await BookKeeper.connect(cluster.uri) as bk:
        await _append_all(bk, 3, 3, 2, Durability.PERSISTENT)
        for bookie in cluster.bookies:
            conn = bk.pool.get_nowait(str(bookie.address))
            assert conn is not None
            assert conn.protocol_version == 1
    assert sum(b.stats.add_batches for b in cluster.bookies) == 0
    assert sum(b.stats.adds for b in cluster.bookies) == APPENDS * 3
