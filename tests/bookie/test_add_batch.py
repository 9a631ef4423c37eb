"""ADD_BATCH (protocol 2) on a real bookie: each entry is handled as its own ADD
would be, one answer names each entry's status, and a batch that does not unpack stores
nothing. The handshake speaks protocols 1 and 2."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from aiobk.bookie import Bookie, BookieConfig
from aiobk.bookie.ops import add_batch as add_batch_op
from aiobk.client import BookieConnection
from aiobk.protocol import (
    PROTOCOL_VERSION,
    AddBatchRequest,
    AddBatchResponse,
    AddFlag,
    Durability,
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
from tests.support.faulty_disk import FaultyDisk
from tests.support.procs import HOST_DISK_SETTINGS


async def _batch(
    conn: BookieConnection,
    ledger: int,
    bodies: list[bytes],
    *,
    flags: AddFlag = AddFlag.NONE,
    durability: Durability = Durability.PERSISTENT,
) -> AddBatchResponse:
    request = AddBatchRequest(
        conn.next_txn_id(), ledger, flags, durability, master_key=KEY, bodies=pack_bodies(bodies)
    )
    response = await conn.send(request, TIMEOUT)
    assert isinstance(response, AddBatchResponse), response
    return response


async def test_a_batch_stores_every_entry_and_answers_once(start_bookie, connect) -> None:
    bookie = await start_bookie()
    conn = await connect(bookie)
    assert conn.protocol_version == PROTOCOL_VERSION >= 2
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
    for version in range(1, PROTOCOL_VERSION + 1):
        hello = await conn.send(HandshakeRequest(conn.next_txn_id(), version, "v"), TIMEOUT)
        assert isinstance(hello, HandshakeResponse)
        assert (hello.status, hello.protocol_version) == (StatusCode.EOK, version)
    newer = HandshakeRequest(conn.next_txn_id(), PROTOCOL_VERSION + 1, "next")
    refused = await conn.send(newer, TIMEOUT)
    assert isinstance(refused, HandshakeResponse)
    assert (refused.status, refused.protocol_version) == (StatusCode.EBADVERSION, PROTOCOL_VERSION)


def _entries(ledger: int, first: int, last: int, tag: bytes) -> list[bytes]:
    return [body(ledger, i, tag + b"%d" % i, lac=i - 1) for i in range(first, last + 1)]


async def test_a_writers_next_batch_is_stored_and_answered_as_one(
    start_bookie, connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of new entries of a ledger in use passes the checks once and is stored,
    journaled and answered as one (``ops.add_batch._add_new``); any other batch goes entry by
    entry through ``add_entry``, as single ADDs would -- the same outcome either way."""
    one_by_one: list[int] = []
    entry_by_entry = add_batch_op.add_entry

    def counted(ctx: Any, add: Any, replier: Any, lac: int, started: float) -> None:
        one_by_one.append(add.entry_id)
        entry_by_entry(ctx, add, replier, lac, started)

    monkeypatch.setattr(add_batch_op, "add_entry", counted)
    bookie = await start_bookie()
    conn = await connect(bookie)
    # A ledger not held yet: its key is admitted first, entry by entry.
    first = await _batch(conn, 3, _entries(3, 0, 9, b"a"))
    assert (first.statuses, one_by_one) == (b"", list(range(10)))
    stats = bookie.stats
    timed, records = stats.histograms.add_entry_request.count, stats.journal_records
    syncs = stats.journal_syncs
    second = await _batch(conn, 3, _entries(3, 10, 59, b"b"))
    assert (second.status, second.statuses, second.last_add_synced) == (StatusCode.EOK, b"", 59)
    assert one_by_one == list(range(10))  # not one entry more: the batch went as one
    assert stats.journal_records - records == 50  # an ADD record each, as replay reads them
    assert stats.histograms.add_entry_request.count - timed == 50  # timed as 50 adds
    assert stats.journal_syncs - syncs <= 2
    for entry in (10, 33, 59):
        got = await read(conn, 3, entry)
        assert DIGEST.verify(parse_entry(got.body), 3, entry) == b"b%d" % entry
    assert (await read(conn, 3, 10)).lac == 58
    volatile = await _batch(conn, 3, _entries(3, 60, 69, b"v"), durability=Durability.VOLATILE)
    assert (volatile.status, volatile.statuses) == (StatusCode.EOK, b"")
    assert one_by_one == list(range(10))
    # An entry held already (69 again, same bytes) sends the batch entry by entry.
    again = await _batch(conn, 3, _entries(3, 69, 70, b"v"))
    assert (again.statuses, one_by_one[10:]) == (b"", [69, 70])
    # A wrong key too: each entry is refused as a single ADD would be.
    wrong = AddBatchRequest(
        conn.next_txn_id(),
        3,
        master_key=bytes(len(KEY)),
        bodies=pack_bodies(_entries(3, 71, 72, b"w")),
    )
    refused = await conn.send(wrong, TIMEOUT)
    assert isinstance(refused, AddBatchResponse)
    assert unpack_statuses(refused.statuses, 2) == [StatusCode.EUA] * 2
    assert one_by_one[12:] == [71, 72]


@pytest.mark.timeout(60)
async def test_a_batch_the_journal_cannot_sync_fails_every_entry(tmp_path: Path, connect) -> None:
    disk = FaultyDisk()
    config = BookieConfig(data_dir=str(tmp_path / "b"), port=0, **HOST_DISK_SETTINGS)
    bookie = Bookie(config, disk=disk)
    await bookie.start()
    try:
        conn = await connect(bookie)
        assert (await _batch(conn, 8, _entries(8, 0, 4, b"x"))).statuses == b""
        disk.sync_error = errno.EIO
        failed = await _batch(conn, 8, _entries(8, 5, 9, b"y"))
        assert failed.status is StatusCode.EOK
        assert unpack_statuses(failed.statuses, 5) == [StatusCode.EIO] * 5
    finally:
        disk.sync_error = 0
        await bookie.stop()
