"""BP-14 volatile ledgers on real bookies: the LAC, force(), no ensemble change, close."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client import BookKeeper, Durability
from aiobk.client.errors import BKError, BookieUnavailableError, NoSuchEntryError
from tests.support.wait import wait_until


async def test_appends_leave_the_lac_behind_until_force(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
        for i in range(20):
            assert await lh.append(b"%d" % i) == i
        assert lh.last_add_pushed == 19
        assert lh.last_add_confirmed < 19  # answered once written: synced later
        reader = await bk.open_ledger(lh.ledger_id, recovery=False)
        with pytest.raises(NoSuchEntryError):
            await reader.read(0, 19)  # reads stop at the LAC
        unconfirmed = await reader.read_unconfirmed(0, 19)  # ... unless asked to go past it
        assert [e.data for e in unconfirmed] == [b"%d" % i for i in range(20)]
        assert await lh.force() == 19
        assert lh.last_add_confirmed == 19
        await lh.close()
        assert lh.metadata.last_entry_id == 19
        assert lh.metadata.durability is Durability.VOLATILE


async def test_force_during_appends_stops_at_what_was_acknowledged_before(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
        for i in range(10):
            await lh.append(b"%d" % i)
        acknowledged_before = lh._pipeline.last_acked
        later = [asyncio.ensure_future(lh.append(b"late %d" % i)) for i in range(200)]
        lac = await lh.force()
        assert lac == acknowledged_before == 9
        await asyncio.gather(*later)
        assert await lh.force() == 209
        await lh.close()


async def test_force_fails_with_a_bookie_down_and_works_once_it_is_back(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
        for i in range(5):
            await lh.append(b"%d" % i)
        victim = cluster.by_id(lh.metadata.ensemble[0])
        port = victim.address.port
        await victim.crash()
        with pytest.raises(BKError) as info:
            await lh.force()
        assert isinstance(info.value, BookieUnavailableError)
        await cluster.restart(victim)
        assert cluster.by_id(lh.metadata.ensemble[0]).address.port == port

        async def forced() -> bool:  # once the client's reconnect backoff passes
            try:
                assert await lh.force() == 4
            except BookieUnavailableError:
                return False
            return True

        await wait_until(forced, timeout=10, what="force() succeeds after the bookie came back")
        await lh.close()


async def test_close_without_force_keeps_what_was_acknowledged(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
        ids = await asyncio.gather(*(lh.append(b"%d" % i) for i in range(50)))
        assert ids == list(range(50))
        await lh.close()  # close-to-open: syncs first, then closes
        rh = await bk.open_ledger(lh.ledger_id)
        assert rh.metadata.last_entry_id == 49
        assert [e.data for e in await rh.read(0, 49)] == [b"%d" % i for i in range(50)]


async def test_a_failing_bookie_fails_volatile_appends_instead_of_changing_ensemble(
    cluster,
) -> None:
    await cluster.add_bookie()  # a spare the ledger must not use
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
        for i in range(5):
            await lh.append(b"%d" % i)
        await lh.force()
        await cluster.by_id(lh.metadata.ensemble[1]).crash()

        async def keep_appending() -> None:
            for i in range(5, 50):
                await lh.append(b"%d" % i)

        with pytest.raises(BookieUnavailableError, match="do not change their ensemble"):
            await keep_appending()
        assert len(lh.metadata.fragments) == 1
        await lh.close()  # still closes, at the LAC it had
        assert lh.metadata.last_entry_id is not None
        assert lh.metadata.last_entry_id >= 4


async def test_volatile_needs_no_striping(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        with pytest.raises(ValueError, match="no striping"):
            await bk.create_ledger(3, 2, 2, durability=Durability.VOLATILE)


async def test_a_cancelled_append_still_lands_and_later_ones_follow(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2)
        waiting = asyncio.ensure_future(lh.append(b"cancelled caller"))
        await asyncio.sleep(0)
        waiting.cancel()
        assert await lh.append(b"next") == 1  # entry 0 still completed underneath
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id)
        assert [e.data for e in await rh.read(0, 1)] == [b"cancelled caller", b"next"]
