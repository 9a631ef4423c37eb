"""A recovery that fails part-way leaves nothing behind: its write-backs in flight are failed,
not left pending forever (found in a review)."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client.add import AddPipeline
from aiobk.client.errors import BadRequestError, LedgerRecoveryError
from aiobk.protocol import StatusCode
from tests.client.fakes import is_add, is_read


async def test_a_failed_recovery_fails_its_pending_write_backs(
    world, monkeypatch: pytest.MonkeyPatch
) -> None:
    bookies = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    for i in range(5):
        await lh.append(b"e%d" % i)
    # The bookies know LAC 3 (entry 4 carried it): recovery reads on from entry 4, writes it
    # back (held: never answered), then cannot tell whether entry 5 exists.
    for bookie in bookies:
        bookie.hold(is_add(recovery=True), times=None)
    for bookie in bookies[:2]:
        bookie.fail(is_read(5), StatusCode.EIO)
    pipelines: list[AddPipeline] = []
    close = AddPipeline.close

    async def recording_close(self: AddPipeline) -> None:
        pipelines.append(self)
        await close(self)

    monkeypatch.setattr(AddPipeline, "close", recording_close)
    recoverer = await world.client(seed=2)
    with pytest.raises(LedgerRecoveryError):
        await asyncio.wait_for(recoverer.open_ledger(lh.ledger_id), 20)
    (pipeline,) = pipelines
    assert pipeline.outstanding == 0  # the write-back of entry 4 did not stay pending
    assert isinstance(pipeline.error, LedgerRecoveryError)


async def test_a_read_the_bookie_rejects_is_a_bad_request_not_a_crash(world) -> None:
    """An ErrorResponse to a READ (the bookie could not take the request) is BadRequestError
    from that bookie: the reader moves on to the next one. It used to fail an assertion."""
    bookies = await world.bookies(3)
    writer = await world.client(seed=1)
    lh = await writer.create_ledger(3, 3, 2)
    await lh.append(b"e0")
    await lh.close()
    for bookie in bookies:
        bookie.reject(is_read(0))
    reader = await world.client(seed=2)
    rh = await reader.open_ledger(lh.ledger_id)
    with pytest.raises(BadRequestError):
        await asyncio.wait_for(rh.read(0, 0), 10)
    bookies[2].rules.clear()  # one bookie answers: the others' rejections are skipped
    assert [e.data for e in await asyncio.wait_for(rh.read(0, 0), 10)] == [b"e0"]
