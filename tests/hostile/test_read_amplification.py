"""Reads a peer never collects must not amplify the bookie's memory.

Before the fix, 1,000 pipelined reads of a 1 MiB entry whose answers were never read took the
bookie from 127 MiB to 1.9 GiB. Now (``bookie.flow``) a connection's unsent responses are
bounded by ``server_write_buffer_high_water_mark``: above it the bookie stops reading the
peer's requests and holds its entry fetches, so the peer holds about one mark plus the few
fetches already under way; over all connections ``max_connection_memory`` closes the biggest
holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from aiobk.bookie.flow import READS_PER_CONNECTION
from aiobk.bookie.ops.read_range import MAX_RANGE_BYTES
from aiobk.protocol import (
    ReadRangeRequest,
    ReadRangeResponse,
    ReadRequest,
    ReadResponse,
    StatusCode,
    unpack_range,
)
from tests.hostile.conftest import Connect, Launch
from tests.hostile.harness import BookieUnderTest, MiB, RssSampler, percentile, summary
from tests.hostile.honest import HonestClient, add_request, entry_body
from tests.hostile.rawclient import RawConnection
from tests.support.wait import wait_until

LEDGER = 50
ENTRY = b"e" * MiB
HIGH_WATER = 1 * MiB  # server_write_buffer_high_water_mark's default, set explicitly below
# What one peer that reads nothing can make the bookie hold: the high-water mark, the frame
# that crossed it, and the fetches admitted before the pause, each an entry and its encoded
# frame; plus 16 MiB for a thousand parked request tasks and allocator slack. Before: +1.8 GiB.
ONE_PEER_BOUND = HIGH_WATER + MiB + READS_PER_CONNECTION * 2 * MiB + 16 * MiB
HOSTILE_READS = 1000
ATTACK_SECONDS = 2.0  # how long each attack is held (sampling RSS, the honest client running)
HONEST_P99 = 1.0  # seconds; on this shared 2-core machine p99 measured < 0.2 s
HONEST_MAX = 2.0


async def _write_entry(conn: RawConnection) -> None:
    added = await conn.call(add_request(conn.next_txn_id(), LEDGER, 0, ENTRY), 30)
    assert added.status is StatusCode.EOK, added
    conn.close()  # only the honest client and the attackers stay connected


async def _attack(
    bookie: BookieUnderTest, connect: Connect, rss: RssSampler, connections: int
) -> list[bool]:
    """``connections`` peers each pipeline HOSTILE_READS reads and read nothing, for
    ATTACK_SECONDS (less if RSS passes the sampler's limit); return which were closed by the
    bookie."""
    peers = []
    for _ in range(connections):
        peer = await connect(bookie)
        peer.send_many(ReadRequest(peer.next_txn_id(), LEDGER, 0) for _ in range(HOSTILE_READS))
        peers.append(peer)
    deadline = time.monotonic() + ATTACK_SECONDS
    while time.monotonic() < deadline and not rss.limit_hit:  # the attack lasts its time
        await asyncio.sleep(0.05)  # pacing: the attack goes on until its time is up
    closed = []
    for peer in peers:
        # A peer the bookie closed gets EOF once it reads what was sent before the close.
        closed.append(peer.eof or await _closed_now(peer))
        peer.abort()
    return closed


async def _closed_now(peer: RawConnection) -> bool:
    """Drain what the bookie sent; True if the stream ended (bounded: 2 s of reading)."""
    return await peer.closed_by_peer(2.0)


async def _settled(bookie: BookieUnderTest, open_connections: int) -> dict[str, int]:
    """Poll until the bookie's flow accounting is back to the honest client's (bounded): the
    last figures, settled or not (the caller says what it needs of them)."""
    seen: list[dict[str, int]] = []

    async def settled() -> bool:
        seen.append(await bookie.stats())
        stats = seen[-1]
        return (
            stats["connections_open"] <= open_connections
            and stats["connection_bytes_held"] < 64 * 1024
        )

    with contextlib.suppress(AssertionError):
        await wait_until(settled, every=0.1, timeout=10, what="the flow accounting settled")
    return seen[-1]


def _assert_honest(honest: HonestClient) -> None:
    assert not honest.failures, honest.failures[:5]
    assert len(honest.latencies) >= 10, "the honest client hardly ran"
    assert percentile(honest.latencies, 0.99) <= HONEST_P99, summary(honest.latencies)
    assert max(honest.latencies) <= HONEST_MAX, summary(honest.latencies)


@pytest.mark.timeout(90)
async def test_pipelined_reads_never_collected_hold_one_high_water_mark(
    launch: Launch, connect: Connect
) -> None:
    bookie = await launch(server_write_buffer_high_water_mark=HIGH_WATER)
    await _write_entry(await connect(bookie))
    honest = HonestClient(bookie.host, bookie.port, read_ledger=LEDGER, read_entry=0)
    async with honest.running():
        await asyncio.sleep(0.5)  # warm: the honest client's 1 MiB reads are in the baseline
        honest.latencies.clear()
        with bookie.sampler(ONE_PEER_BOUND, bookie.kill_now) as rss:
            # Two rounds: what the first peer made the bookie hold is released when it goes,
            # so the second does not add to it.
            for attempt in range(2):
                closed = await _attack(bookie, connect, rss, connections=1)
                assert rss.growth <= ONE_PEER_BOUND, (
                    f"round {attempt}: RSS grew {rss.growth / MiB:.0f} MiB, bound "
                    f"{ONE_PEER_BOUND / MiB:.0f} MiB"
                )
                assert closed == [False], "a peer alone under every bound was closed"
                # Two connections stay: the honest client's and the one asking for stats.
                stats = await _settled(bookie, open_connections=2)
                assert stats["connection_bytes_held"] < 64 * 1024, stats
                assert stats["connections_open"] <= 2, stats
        _assert_honest(honest)
    assert stats["connections_shed"] == 0, stats
    assert bookie.terminate() == 0, bookie.log_text()

    await bookie.start()
    conn = await connect(bookie)
    response = await conn.call(ReadRequest(conn.next_txn_id(), LEDGER, 0), 30)
    assert isinstance(response, ReadResponse), response
    assert response.status is StatusCode.EOK
    assert response.body == entry_body(LEDGER, 0, ENTRY)


@pytest.mark.timeout(90)
async def test_peers_over_max_connection_memory_lose_the_biggest(
    launch: Launch, connect: Connect
) -> None:
    limit = 6 * MiB  # at least two max_frame_size frames (the config's floor)
    peers = 6  # each holds about two MiB once its responses back up: about twice the limit
    bookie = await launch(
        max_frame_size=3 * MiB,
        max_connection_memory=limit,
        server_write_buffer_high_water_mark=HIGH_WATER,
    )
    await _write_entry(await connect(bookie))
    honest = HonestClient(bookie.host, bookie.port, read_ledger=LEDGER, read_entry=0)
    async with honest.running():
        await asyncio.sleep(0.5)  # warm-up: the honest client's first reads stay out
        honest.latencies.clear()
        bound = limit + ONE_PEER_BOUND  # the sum, plus what the peer crossing it holds
        with bookie.sampler(bound, bookie.kill_now) as rss:
            closed = await _attack(bookie, connect, rss, connections=peers)
        assert rss.growth <= bound, f"RSS grew {rss.growth / MiB:.0f} MiB"
        stats = await _settled(bookie, open_connections=2)
        _assert_honest(honest)  # never the biggest holder: never closed, never slow
    assert stats["connections_shed"] >= 1, stats
    assert sum(closed) >= 1, closed
    assert stats["connection_bytes_held"] < 64 * 1024, stats
    assert bookie.terminate() == 0, bookie.log_text()


@pytest.mark.timeout(60)
async def test_a_peer_that_never_reads_its_answers_is_closed_after_write_timeout(
    launch: Launch, connect: Connect
) -> None:
    """Under every bound one such peer could still hold its high-water mark for ever; after
    ``write_timeout`` with its responses unsendable the bookie lets it go."""
    bookie = await launch(server_write_buffer_high_water_mark=HIGH_WATER, write_timeout=2.0)
    await _write_entry(await connect(bookie))
    peer = await connect(bookie)
    peer.send_many(ReadRequest(peer.next_txn_id(), LEDGER, 0) for _ in range(HOSTILE_READS))
    await asyncio.sleep(1.0)  # paused, under the timeout: not closed yet
    stats = await bookie.stats()
    assert stats["connections_open"] >= 2, stats  # the peer and the one asking
    started = time.monotonic()
    stats = await _settled(bookie, open_connections=1)
    assert stats["connections_open"] <= 1, stats  # the peer is gone
    assert stats["connections_timed_out"] >= 1, stats
    assert stats["connection_bytes_held"] < 64 * 1024, stats
    assert time.monotonic() - started < 4.0  # write_timeout plus the one-second sweep
    assert await peer.closed_by_peer(5.0)
    assert bookie.terminate() == 0, bookie.log_text()


RUN_ENTRIES = 6  # 6 MiB of entries: each answer a full run (MAX_RANGE_BYTES and one more entry)
# A range read's fetch holds a run, not an entry: the same bound with a run in place of each.
RANGE_PEER_BOUND = (
    HIGH_WATER + MAX_RANGE_BYTES + READS_PER_CONNECTION * 2 * (MAX_RANGE_BYTES + MiB) + 16 * MiB
)


@pytest.mark.timeout(90)
async def test_pipelined_range_reads_never_collected_hold_a_bounded_share(
    launch: Launch, connect: Connect
) -> None:
    """A peer pipelines a thousand READ_RANGEs of a run as large as the bookie sends and
    reads nothing: the bookie holds a high-water mark and its few turns' runs, no more."""
    bookie = await launch(server_write_buffer_high_water_mark=HIGH_WATER)
    writer = await connect(bookie)
    for entry_id in range(RUN_ENTRIES):
        added = await writer.call(add_request(writer.next_txn_id(), LEDGER, entry_id, ENTRY), 30)
        assert added.status is StatusCode.EOK, added
    writer.close()
    with bookie.sampler(RANGE_PEER_BOUND, bookie.kill_now) as rss:
        peer = await connect(bookie)
        peer.send_many(
            ReadRangeRequest(peer.next_txn_id(), LEDGER, 0, RUN_ENTRIES - 1, 2**62)
            for _ in range(HOSTILE_READS)
        )
        deadline = time.monotonic() + ATTACK_SECONDS
        while time.monotonic() < deadline and not rss.limit_hit:
            await asyncio.sleep(0.05)  # pacing: the attack goes on until its time is up
        assert rss.growth <= RANGE_PEER_BOUND, (
            f"RSS grew {rss.growth / MiB:.0f} MiB, bound {RANGE_PEER_BOUND / MiB:.0f} MiB"
        )
        closed = peer.eof or await _closed_now(peer)
        assert not closed, "a peer under every bound was closed"
        peer.abort()
    stats = await _settled(bookie, open_connections=1)
    assert stats["connection_bytes_held"] < 64 * 1024, stats
    conn = await connect(bookie)
    answer = await conn.call(ReadRangeRequest(conn.next_txn_id(), LEDGER, 0, 9, 2**62), 30)
    assert isinstance(answer, ReadRangeResponse), answer
    assert answer.status is StatusCode.EOK
    bodies = unpack_range(answer.bodies, LEDGER, 0, 9)
    assert bodies == [entry_body(LEDGER, i, ENTRY) for i in range(len(bodies))]
    assert len(bodies) == MAX_RANGE_BYTES // len(bodies[0])  # as many as the cap holds
