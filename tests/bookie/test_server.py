"""A real bookie on loopback, driven through the client's connection."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.protocol import (
    LAC_ENTRY_ID,
    PROTOCOL_VERSION,
    ForceRequest,
    ForceResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    HandshakeRequest,
    HandshakeResponse,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    StatusCode,
    WriteLacRequest,
    WriteLacResponse,
    master_key,
    parse_entry,
)
from aiobk.protocol.errors import ProtocolVersionError
from tests.bookie.helpers import DIGEST, KEY, TIMEOUT, add, add_request, read
from tests.support.wait import wait_until


async def test_add_then_read_back(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    assert conn.bookie_id == str(bookie.address)
    for entry in range(5):
        response = await add(conn, 7, entry, b"payload-%d" % entry, lac=entry - 1)
        assert response.status is StatusCode.EOK
    got = await read(conn, 7, 3)
    assert got.status is StatusCode.EOK
    assert got.lac == 3  # piggybacked by entry 4
    assert got.last_entry_id == 4
    assert DIGEST.verify(parse_entry(got.body), 7, 3) == b"payload-3"
    assert (await read(conn, 7, 9)).status is StatusCode.ENOENTRY
    assert (await read(conn, 8, 0)).status is StatusCode.ENOLEDGER


async def test_pipelined_adds_share_fdatasyncs(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    futures = [conn.send(add_request(conn, 1, i, b"x" * 100), TIMEOUT) for i in range(500)]
    responses = await asyncio.gather(*futures)
    assert all(r.status is StatusCode.EOK for r in responses)
    assert bookie.stats.journal_syncs < 250, bookie.stats.journal_syncs


async def test_responses_come_back_out_of_order(start_bookie, connect) -> None:
    """An add waiting for its group commit does not hold back a read sent after it."""
    bookie = await start_bookie(journal_max_group_wait=1.0, journal_flush_when_queue_empty=False)
    conn = await connect(bookie)
    assert (await add(conn, 2, 0, b"stored")).status is StatusCode.EOK  # waits the full second
    slow = asyncio.ensure_future(conn.send(add_request(conn, 2, 1, b"waits"), TIMEOUT))
    quick = asyncio.ensure_future(read(conn, 2, 0))
    done, _ = await asyncio.wait({slow, quick}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {quick}, "the read should overtake the add waiting for its fdatasync"
    assert (await quick).status is StatusCode.EOK
    assert (await slow).status is StatusCode.EOK


async def test_a_client_of_another_protocol_version_is_refused(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    response = await conn.send(HandshakeRequest(conn.next_txn_id(), 99, "from-the-future"), TIMEOUT)
    assert isinstance(response, HandshakeResponse)
    assert response.status is StatusCode.EBADVERSION
    assert response.protocol_version == PROTOCOL_VERSION  # the bookie names its newest
    with pytest.raises(ProtocolVersionError) as refused:
        await conn.call(HandshakeRequest(0, PROTOCOL_VERSION + 1, "next"), TIMEOUT)
    assert refused.value.code == StatusCode.EBADVERSION
    assert (await add(conn, 4, 0, b"still served")).status is StatusCode.EOK


async def test_wrong_password_is_unauthorized(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    assert (await add(conn, 3, 0, b"a")).status is StatusCode.EOK
    wrong = master_key(b"not the secret")
    assert (await add(conn, 3, 1, b"b", key=wrong)).status is StatusCode.EUA
    fence = await read(conn, 3, LAC_ENTRY_ID, flags=ReadFlag.FENCE, key=wrong)
    assert fence.status is StatusCode.EUA
    request = WriteLacRequest(conn.next_txn_id(), 3, wrong, 0)
    assert (await conn.send(request, TIMEOUT)).status is StatusCode.EUA
    assert bookie.stats.auth_failures == 3
    assert (await read(conn, 3, 1)).status is StatusCode.ENOENTRY


async def test_fence_refuses_normal_adds_but_takes_recovery_adds(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    await add(conn, 5, 0, b"zero")
    fenced = await read(conn, 5, LAC_ENTRY_ID, flags=ReadFlag.FENCE, key=KEY)
    assert fenced.status is StatusCode.EOK
    assert fenced.last_entry_id == 0
    assert (await add(conn, 5, 1, b"one")).status is StatusCode.EFENCED
    assert (await add(conn, 5, 1, b"one", recovery=True)).status is StatusCode.EOK


async def test_fence_of_unknown_ledger_creates_it_fenced(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    response = await read(conn, 11, 0, flags=ReadFlag.FENCE, key=KEY)
    assert response.status is StatusCode.ENOENTRY  # the ledger exists now, the entry does not
    assert (await add(conn, 11, 0, b"late")).status is StatusCode.EFENCED


async def test_long_poll_wakes_on_add(start_bookie, connect) -> None:
    bookie = await start_bookie()
    writer = await connect(bookie)
    reader = await connect(bookie)
    await add(writer, 2, 0, b"a")
    poll = asyncio.ensure_future(
        read(reader, 2, 0, flags=ReadFlag.LONG_POLL, previous_lac=-1, timeout_ms=10_000)
    )
    state = bookie.storage.ledgers[2]
    await wait_until(lambda: len(state.waiters) == 1, what="the poll waits at the bookie")
    assert not poll.done()
    await add(writer, 2, 1, b"b", lac=0)  # piggybacks LAC 0
    response = await asyncio.wait_for(poll, 5)
    assert response.status is StatusCode.EOK
    assert response.lac == 0
    assert DIGEST.verify(parse_entry(response.body), 2, 0) == b"a"
    assert state.waiters == set()


async def test_long_poll_times_out_cleanly(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    await add(conn, 4, 0, b"a")
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await read(conn, 4, 0, flags=ReadFlag.LONG_POLL, previous_lac=-1, timeout_ms=200)
    assert loop.time() - started >= 0.19
    assert response.status is StatusCode.EOK
    assert response.lac == -1
    assert response.body is None
    assert bookie.storage.ledgers[4].waiters == set()


async def test_long_poll_waiter_released_when_client_leaves(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    await add(conn, 6, 0, b"a")
    conn.send(
        _long_poll_request(conn, 6),
        TIMEOUT,
    ).add_done_callback(lambda f: f.exception())
    await wait_until(lambda: len(bookie.storage.ledgers[6].waiters) == 1, what="poll waiting")
    conn.close()
    await wait_until(
        lambda: not bookie.storage.ledgers[6].waiters, every=0.01, what="the poll released"
    )


def _long_poll_request(conn, ledger):
    from aiobk.protocol import ReadRequest

    return ReadRequest(conn.next_txn_id(), ledger, 0, ReadFlag.LONG_POLL, b"", -1, 60_000)


async def test_lac_read_write_force_and_info(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    await add(conn, 9, 0, b"a")
    await add(conn, 9, 1, b"b")
    written = await conn.send(WriteLacRequest(conn.next_txn_id(), 9, KEY, 1), TIMEOUT)
    assert isinstance(written, WriteLacResponse)
    assert written.status is StatusCode.EOK
    lac = await conn.send(ReadLacRequest(conn.next_txn_id(), 9), TIMEOUT)
    assert isinstance(lac, ReadLacResponse)
    assert (lac.lac, lac.last_entry_id) == (1, 1)
    missing = await conn.send(ReadLacRequest(conn.next_txn_id(), 99), TIMEOUT)
    assert missing.status is StatusCode.ENOLEDGER
    forced = await conn.send(ForceRequest(conn.next_txn_id(), 9, KEY), TIMEOUT)
    assert isinstance(forced, ForceResponse)
    assert forced.status is StatusCode.EOK
    info = await conn.send(GetBookieInfoRequest(conn.next_txn_id()), TIMEOUT)
    assert isinstance(info, GetBookieInfoResponse)
    assert 0 < info.free_bytes <= info.total_bytes
    assert info.stats["adds"] == 2
