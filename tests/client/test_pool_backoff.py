"""A bookie's reconnect backoff and the sends of a ledger (fake bookies, no sleeps but the
backoff itself)."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client.errors import BookieUnavailableError
from tests.client.conftest import FakeWorld

pytestmark = pytest.mark.timeout(30)


async def test_a_send_waits_out_a_backoff_set_by_another_request(world: FakeWorld) -> None:
    """A bookie refused one connect while it restarted (another request found it down); an
    add sent within the backoff waits it out and reaches the bookie, now back, instead of
    failing at once and changing the ledger's ensemble away from it."""
    bookies = await world.bookies(3)
    bk = await world.client(reconnect_backoff_min=0.2, reconnect_backoff_max=0.2)
    lh = await bk.create_ledger(3, 3, 2)
    assert await lh.append(b"first") == 0
    ensemble = list(lh.metadata.ensemble)
    target = bookies[0]
    target.crash()
    await asyncio.sleep(0)
    with pytest.raises(BookieUnavailableError):  # someone else's connect: the backoff starts
        await bk.pool.get(target.bookie_id)
    with pytest.raises(BookieUnavailableError, match="failed recently"):
        await bk.pool.get(target.bookie_id)
    target.revive()  # back, within the backoff
    assert await lh.append(b"second") == 1
    assert list(lh.metadata.ensemble) == ensemble
    assert len(lh.metadata.fragments) == 1


async def test_a_long_backoff_still_fails_at_once(world: FakeWorld) -> None:
    """Past the patience a send does not wait: a bookie down for a while is replaced."""
    await world.bookies(4)
    bk = await world.client(reconnect_backoff_min=30.0, reconnect_backoff_max=30.0)
    lh = await bk.create_ledger(3, 3, 2)
    await lh.append(b"first")
    victim = world.network.bookies[lh.metadata.ensemble[0]]
    victim.crash()
    await asyncio.sleep(0)
    with pytest.raises(BookieUnavailableError):
        await bk.pool.get(victim.bookie_id)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await lh.append(b"second") == 1
    assert loop.time() - started < 5.0
    assert victim.bookie_id not in lh.metadata.ensemble
