"""ADD_BATCH (protocol 2, issue 19) on a real bookie: each entry is handled as its own ADD
would be, one answer names each entry's status, and a batch that does not unpack stores
nothing. The handshake speaks protocols 1 and 2."""

from __future__ import annotations

from aiobk.client import BookieConnection
from aiobk.protocol import (
    PROTOCOL_VERSION,
    AddBatchRequest,
    AddBatchResponse,
    AddFlag,
    ErrorResponse,
    HandshakeRequest,
    HandshakeResponse,
    ReadFlag,
    StatusCode,
    pack_bodies,
    parse_entry,
    unpack_statuses,
)
from tests.bookie.helpers import DIGEST, KEY, TIMEOUT, add, body, read


async def _batch(
    conn: BookieConnection,
    ledger: int,
    bodies: list[bytes],
    *,
    flags: AddFlag = AddFlag.NONE,
) -> AddBatchResponse:
    request = AddBatchRequest(
        conn.next_txn_id(), ledger, flags, master_key=KEY, bodies=pack_bodies(bodies)
    )
    response = await conn.send(request, TIMEOUT)
    assert isinstance(response, AddBatchResponse), response
    return response


async def test_a_batch_stores_every_entry_and_answers_once(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    assert conn.protocol_version == PROTOCOL_VERSION == 2
    syncs = bookie.stats.journal_syncs
    response = await _batch(conn, 7, [body(7, i, b"e%d" % i, lac=i - 1) for i in range(50)])
    assert (response.status, response.statuses) == (StatusCode.EOK, b"")
    assert response.ledger_id == 7
    assert bookie.stats.journal_syncs - syncs <= 2  # one group commit, give or take a turn
    for entry in (0, 17, 49):
        got = await read(conn, 7, entry)
        assert DIGEST.verify(parse_entry(got.body), 7, entry) == b"e%d" % entry
    assert (await read(conn, 7, 0)).lac == 48  # piggybacked by entry 49
    # The next entries may come one by one again.
    assert (await add(conn, 7, 50, b"single", lac=49)).status is StatusCode.EOK


async def test_each_entry_gets_its_own_status(start_bookie, connect) -> None:
    """Entry 1 is held with other bytes (refused, the copy held stays), entry 2 is the same
    entry again (acknowledged), entry 3 is new."""
    bookie = await start_bookie()
    conn = await connect(bookie)
    for entry in range(3):
        assert (await add(conn, 9, entry, b"first")).status is StatusCode.EOK
    bodies = [body(9, 1, b"other"), body(9, 2, b"first"), body(9, 3, b"new")]
    response = await _batch(conn, 9, bodies)
    assert response.status is StatusCode.EOK
    assert unpack_statuses(response.statuses, 3) == [
        StatusCode.EBADREQ,
        StatusCode.EOK,
        StatusCode.EOK,
    ]
    assert DIGEST.verify(parse_entry((await read(conn, 9, 1)).body), 9, 1) == b"first"
    assert DIGEST.verify(parse_entry((await read(conn, 9, 3)).body), 9, 3) == b"new"


async def test_a_fenced_ledger_refuses_a_batch_but_a_recovery_batch_lands(
    start_bookie, connect
) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    assert (await add(conn, 4, 0, b"x")).status is StatusCode.EOK
    fenced = await read(conn, 4, -1, flags=ReadFlag.FENCE, key=KEY)
    assert fenced.status is StatusCode.EOK
    bodies = [body(4, 1, b"late"), body(4, 2, b"later")]
    refused = await _batch(conn, 4, bodies)
    assert unpack_statuses(refused.statuses, 2) == [StatusCode.EFENCED] * 2
    assert (await read(conn, 4, 1)).status is StatusCode.ENOENTRY
    landed = await _batch(conn, 4, bodies, flags=AddFlag.RECOVERY_ADD)
    assert (landed.status, landed.statuses) == (StatusCode.EOK, b"")
    assert (await read(conn, 4, 2)).status is StatusCode.EOK


async def test_a_batch_that_does_not_unpack_stores_nothing(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    other_ledger = [body(5, 0, b"a"), body(6, 1, b"b")]
    refused = await _batch(conn, 5, other_ledger)
    assert refused.status is StatusCode.EBADREQ
    out_of_order = [body(5, 1, b"a"), body(5, 0, b"b")]
    assert (await _batch(conn, 5, out_of_order)).status is StatusCode.EBADREQ
    assert (await read(conn, 5, 0)).status is StatusCode.ENOLEDGER
    keyless = AddBatchRequest(conn.next_txn_id(), 5, bodies=pack_bodies([body(5, 0, b"a")]))
    refused_at_the_door = await conn.send(keyless, TIMEOUT)  # protocol.limits: a key is required
    assert isinstance(refused_at_the_door, ErrorResponse)
    assert refused_at_the_door.status is StatusCode.EBADREQ
    assert bookie.stats.bad_requests >= 3
    # The connection serves on.
    assert (await add(conn, 5, 0, b"fine")).status is StatusCode.EOK


async def test_the_handshake_speaks_every_version_from_the_first(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    for version in (1, 2):
        hello = await conn.send(HandshakeRequest(conn.next_txn_id(), version, "v"), TIMEOUT)
        assert isinstance(hello, HandshakeResponse)
        assert (hello.status, hello.protocol_version) == (StatusCode.EOK, version)
    refused = await conn.send(HandshakeRequest(conn.next_txn_id(), 3, "v3"), TIMEOUT)
    assert isinstance(refused, HandshakeResponse)
    assert (refused.status, refused.protocol_version) == (StatusCode.EBADVERSION, 2)
