"""How the client takes the statuses a hardened bookie answers: ENOLEDGER to an add
(garbage-collected after a delete), EREADONLY to an add (disk full), ETOOMANYREQUESTS to a
long poll (too many of them on the bookie)."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client.errors import NoSuchLedgerError
from aiobk.protocol import ReadFlag, ReadRequest, Request, StatusCode
from tests.client.fakes import is_add
from tests.support.wait import wait_until


async def test_enoledger_on_an_add_fails_the_ledger_without_an_ensemble_change(world) -> None:
    bookies = await world.bookies(4)  # a spare: an ensemble change would have somewhere to go
    bk = await world.client()
    lh = await bk.create_ledger(3, 3, 2)
    assert await lh.append(b"kept") == 0
    for bookie in bookies:
        if bookie.bookie_id in lh.metadata.ensemble:
            bookie.fail(is_add(), StatusCode.ENOLEDGER)  # their GC dropped the deleted ledger
    with pytest.raises(NoSuchLedgerError, match="garbage-collected"):
        await lh.append(b"into a deleted ledger")
    with pytest.raises(NoSuchLedgerError):
        await lh.append(b"and the next")
    metadata = await world.store.read_ledger(lh.ledger_id)
    assert len(metadata.fragments) == 1  # no replacement: that would recreate the ledger
    spare = next(b for b in bookies if b.bookie_id not in lh.metadata.ensemble)
    assert lh.ledger_id not in spare.ledgers


async def test_ereadonly_on_an_add_changes_the_ensemble(world) -> None:
    bookies = await world.bookies(4)
    bk = await world.client()
    lh = await bk.create_ledger(3, 3, 2)
    for i in range(3):
        await lh.append(b"%d" % i)
    full = next(b for b in bookies if b.bookie_id == lh.metadata.ensemble[1])
    full.fail(is_add(), StatusCode.EREADONLY)  # its disk filled up
    assert await asyncio.gather(*(lh.append(b"%d" % i) for i in range(3, 10))) == list(range(3, 10))
    assert full.bookie_id not in lh.metadata.ensemble
    assert [f.first_entry_id for f in lh.metadata.fragments] == [0, 3]
    spare = next(b for b in bookies if b.bookie_id == lh.metadata.ensemble[1])
    await wait_until(lambda: all(spare.has(lh.ledger_id, e) for e in range(3, 10)), every=0)
    await lh.close()
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    assert [e.data for e in await rh.read(0, 9)] == [b"%d" % i for i in range(10)]


async def test_long_poll_backs_off_when_bookies_answer_too_many_requests(world) -> None:
    bookies = await world.bookies(3)
    writer = await world.client()
    lh = await writer.create_ledger(3, 3, 2)
    await lh.append(b"0")
    await lh.append(b"1")  # carries LAC 0 to the bookies
    reader = await world.client(seed=2, long_poll_timeout=5.0)
    rh = await reader.open_ledger(lh.ledger_id, recovery=False)
    assert rh.last_add_confirmed == 0
    polls = 0

    def overloaded(request: Request) -> bool:
        nonlocal polls
        if isinstance(request, ReadRequest) and request.flags & ReadFlag.LONG_POLL:
            polls += 1
            return True
        return False

    for bookie in bookies:
        bookie.fail(overloaded, StatusCode.ETOOMANYREQUESTS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await rh.wait_for_lac(0, timeout=1.5) == 0  # no news, and no error
    assert loop.time() - started >= 1.4  # it kept asking until its deadline ...
    # ... but backing off (0.05 s doubling up to 1 s) between rounds of at most three polls,
    # rather than spinning: a few rounds, not hundreds.
    assert 3 <= polls <= 3 * 7
