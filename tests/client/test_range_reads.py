"""A closed ledger read in runs (READ_RANGE, protocol 3) against real bookies in process: the
same bodies, in the same order, as entry-by-entry reads -- whatever stops a run short (a
bookie's caps, an entry that fails, an older bookie, a striped ensemble)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aiobk.bookie import Bookie
from aiobk.bookie.context import BookieContext, Replier
from aiobk.bookie.entrylog.format import log_name, unpack_location
from aiobk.bookie.ops import HANDLERS, admin
from aiobk.bookie.ops.read_range import MAX_RANGE_BYTES, MAX_RANGE_ENTRIES
from aiobk.bookie.storage import LedgerStorage
from aiobk.client import BookKeeper
from aiobk.client.digest import Digester
from aiobk.client.range_read import RangeReader
from aiobk.client.read import EntryReader
from aiobk.protocol import (
    MAX_ENTRY_ID,
    EntryBody,
    ErrorResponse,
    OpCode,
    ReadRangeRequest,
    ReadRangeResponse,
    ReadRequest,
    ReadResponse,
    Request,
    StatusCode,
    parse_entry,
    unpack_range,
)
from tests.support.cluster import Cluster

PASSWORD = b"pw"


def _payload(entry_id: int) -> bytes:
    size = 1_500_000 if entry_id == 700 else 200 + entry_id % 900  # one larger than a run
    return (b"%06d-" % entry_id) * (size // 7 + 1)


async def _ledger(bk: BookKeeper, count: int, ensemble: tuple[int, int, int] = (3, 3, 2)) -> int:
    lh = await bk.create_ledger(*ensemble, password=PASSWORD)
    await asyncio.gather(*(lh.append(_payload(i)) for i in range(count)))
    await lh.close()
    return lh.ledger_id


async def _bodies(
    bk: BookKeeper,
    ledger_id: int,
    first: int = 0,
    timeout: float = 10.0,
    ahead: int = 8 * 1024 * 1024,
) -> list[EntryBody]:
    metadata = await bk.store.read_ledger(ledger_id)
    assert metadata.last_entry_id is not None
    digest = Digester(metadata.digest_type, PASSWORD)
    config = bk.context.config
    entries = EntryReader(ledger_id, digest, bk.pool, config, bk.stats)
    reader = RangeReader(entries, digest, bk.pool, timeout, ahead, bk.stats)
    return [
        parse_entry(raw) async for raw in reader.bodies(metadata, first, metadata.last_entry_id)
    ]


def _run(answer: object, status: StatusCode) -> ReadRangeResponse:
    assert isinstance(answer, ReadRangeResponse), answer
    assert answer.status is status, answer
    return answer


def _range_reads(cluster: Cluster) -> int:
    return sum(bookie.stats.range_reads for bookie in cluster.bookies)


def _check(bodies: list[EntryBody], count: int, first: int = 0) -> None:
    assert [body.entry_id for body in bodies] == list(range(first, count))
    assert all(body.payload == _payload(body.entry_id) for body in bodies)


async def test_a_closed_ledger_reads_in_runs(cluster: Cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        ledger_id = await _ledger(bk, 8000)
        _check(await _bodies(bk, ledger_id), 8000)
        for bookie in cluster.bookies:  # from RocksDB now, not the write cache
            await bookie.checkpoint()
        _check(await _bodies(bk, ledger_id), 8000)
        _check(await _bodies(bk, ledger_id, first=7999), 8000, first=7999)
    # About 0.6 KiB each, 6 MB in all: a run is cut at 1,024 entries or 1 MiB, and the one
    # large entry early on makes no run after it shorter.
    assert 12 <= _range_reads(cluster) <= 36, _range_reads(cluster)


async def test_an_older_bookie_is_read_entry_by_entry(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bookies whose handshake stops at protocol 2, as 0.1.0's does: no READ_RANGE is sent."""
    monkeypatch.setattr(admin, "PROTOCOL_VERSION", 2)
    async with await BookKeeper.connect(cluster.uri) as bk:
        ledger_id = await _ledger(bk, 800)
        _check(await _bodies(bk, ledger_id), 800)
    assert _range_reads(cluster) == 0


async def test_a_striped_ledger_is_read_entry_by_entry(cluster: Cluster) -> None:
    """Ensemble 5, write quorum 3: no bookie holds every entry of a run."""
    while len(cluster.bookies) < 5:
        await cluster.add_bookie()
    async with await BookKeeper.connect(cluster.uri) as bk:
        ledger_id = await _ledger(bk, 500, (5, 3, 2))
        _check(await _bodies(bk, ledger_id), 500)
    assert _range_reads(cluster) == 0


async def test_runs_that_fail_fall_back_to_the_entry_and_go_on(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every bookie fails a run that starts at entry 1,000 (EIO): that entry is read by a
    plain READ, and runs go on from the next one."""
    real = LedgerStorage.read_entries

    async def failing(
        self: LedgerStorage, state: object, first: int, last: int, max_bytes: int
    ) -> list[bytes]:
        if first == 1000:
            raise OSError("a failing disk")
        return await real(self, state, first, last, max_bytes)  # type: ignore[arg-type]

    async with await BookKeeper.connect(cluster.uri) as bk:
        ledger_id = await _ledger(bk, 2200)
        monkeypatch.setattr(LedgerStorage, "read_entries", failing)
        _check(await _bodies(bk, ledger_id), 2200)


async def _damage(bookie: Bookie, ledger_id: int, entry_id: int, at: int = 40) -> None:
    """Flip the bits of byte ``at`` of the stored record of ``entry_id`` in its entry log file
    (40: in its body; 0: the top byte of its length)."""
    await bookie.storage.entry_logger.flush()
    state = bookie.storage.get(ledger_id)
    assert state is not None
    log_id, offset = unpack_location(state.location(entry_id))
    path = next(Path(bookie.config.data_dir).rglob(log_name(log_id)))
    with open(path, "r+b") as file:
        file.seek(offset + at)
        byte = file.read(1)
        file.seek(offset + at)
        file.write(bytes([byte[0] ^ 0xFF]))


async def test_a_damaged_entry_ends_a_run_and_answers_eio(cluster: Cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        ledger_id = await _ledger(bk, 300)
        victim = cluster.bookies[0]
        await _damage(victim, ledger_id, 120)
        conn = await bk.pool.get(str(victim.address))
        runs = []
        for first in (100, 120, 121):
            request = ReadRangeRequest(conn.next_txn_id(), ledger_id, first, 299, 1 << 20)
            runs.append(await conn.send(request, 10))
        before = _run(runs[0], StatusCode.EOK)
        assert len(unpack_range(before.bodies, ledger_id, 100, 299)) == 20  # 100..119
        assert _run(runs[1], StatusCode.EIO).bodies == b""
        _run(runs[2], StatusCode.EOK)
        # The client's read goes to another bookie's copy for the damaged entry.
        _check(await _bodies(bk, ledger_id), 300)


async def test_a_run_is_bounded_whatever_a_peer_asks(cluster: Cluster) -> None:
    """A peer asking for every entry id there is and 2**62 bytes gets one run within the
    bookie's caps; a range backwards is a bad request, and the connection stays."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        ledger_id = await _ledger(bk, 3000)
        conn = await bk.pool.get(str(cluster.bookies[0].address))
        greedy = ReadRangeRequest(conn.next_txn_id(), ledger_id, 0, MAX_ENTRY_ID, 2**62)
        answer = _run(await conn.send(greedy, 10), StatusCode.EOK)
        bodies = unpack_range(answer.bodies, ledger_id, 0, MAX_ENTRY_ID)
        assert len(bodies) <= MAX_RANGE_ENTRIES
        assert sum(map(len, bodies[1:])) <= MAX_RANGE_BYTES
        backwards = ReadRangeRequest(conn.next_txn_id(), ledger_id, 5, 4, 100)
        refused = await conn.send(backwards, 10)
        assert isinstance(refused, ErrorResponse)
        assert refused.status is StatusCode.EBADREQ
        missing = ReadRangeRequest(conn.next_txn_id(), ledger_id, 3000, 3100, 100)
        _run(await conn.send(missing, 10), StatusCode.ENOENTRY)
        absent = ReadRangeRequest(conn.next_txn_id(), ledger_id + 99, 0, 10, 100)
        _run(await conn.send(absent, 10), StatusCode.ENOLEDGER)


async def test_a_bookie_that_never_answers_costs_one_timeout_not_one_per_run(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first bookie of the ensemble takes range reads and never answers them. With one
    run in flight at a time (a 1 MiB window), each of the ledger's six runs would wait out the
    timeout on it; the reader asks it last once it has failed, so one timeout is all."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        ledger_id = await _ledger(bk, 6000)
        metadata = await bk.store.read_ledger(ledger_id)
        silent = cluster.by_id(metadata.ensemble[0]).context
        real = HANDLERS[OpCode.READ_RANGE]
        asked: list[int] = []

        def never_answers(ctx: BookieContext, request: Request, conn: Replier) -> None:
            if ctx is silent:
                asked.append(request.txn_id)
                return
            real(ctx, request, conn)

        monkeypatch.setitem(HANDLERS, OpCode.READ_RANGE, never_answers)
        started = asyncio.get_running_loop().time()
        _check(await _bodies(bk, ledger_id, timeout=1.0, ahead=1024 * 1024), 6000)
        took = asyncio.get_running_loop().time() - started
    assert len(asked) == 1, asked
    assert took < 4.0, took


async def test_a_damaged_length_is_eio_not_a_read_of_gigabytes(cluster: Cluster) -> None:
    """A record whose length says nearly 4 GiB: a READ of it and a run from it are EIO at
    once, and a run before it stops short of it."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        ledger_id = await _ledger(bk, 300)
        victim = cluster.bookies[0]
        await _damage(victim, ledger_id, 150, at=0)
        conn = await bk.pool.get(str(victim.address))
        read = await conn.send(ReadRequest(conn.next_txn_id(), ledger_id, 150), 10)
        assert isinstance(read, ReadResponse)
        assert read.status is StatusCode.EIO
        at = ReadRangeRequest(conn.next_txn_id(), ledger_id, 150, 299, 1 << 20)
        assert _run(await conn.send(at, 10), StatusCode.EIO).bodies == b""
        before = ReadRangeRequest(conn.next_txn_id(), ledger_id, 140, 299, 1 << 20)
        run = _run(await conn.send(before, 10), StatusCode.EOK)
        assert len(unpack_range(run.bodies, ledger_id, 140, 299)) == 10
        _check(await _bodies(bk, ledger_id), 300)
