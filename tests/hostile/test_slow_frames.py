"""Peers that start frames and never finish them, or connect and say nothing, must not hold the
bookie's memory or its connections for as long as they like.

Before the fix 100 connections each sending 5 MiB - 1 bytes of a frame held 538 MiB for good.
Now (``bookie.flow``) partial frames count against ``max_connection_memory`` (the biggest
holder is closed), a frame must be complete within ``frame_timeout``, a silent connection with
nothing in flight is closed after ``connection_idle_timeout``, and at ``max_connections`` a new
connection takes the place of the one idle longest, or is refused when none is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time

import pytest

from aiobk.protocol import HandshakeRequest, HandshakeResponse, ReadFlag, ReadRequest, StatusCode
from tests.hostile.conftest import Connect, Launch
from tests.hostile.harness import MiB, summary
from tests.hostile.honest import HONEST_LEDGER, HonestClient
from tests.hostile.rawclient import RawConnection
from tests.support.wait import wait_until

FRAME = 1 * MiB  # max_frame_size in these tests (the default is 5 MiB)
MEMORY = 8 * MiB  # max_connection_memory: eight partial frames
FRAME_TIMEOUT = 2.0
IDLE_TIMEOUT = 3.0
SWEEP = 1.0  # bookie.flow.SWEEP_INTERVAL: deadlines are checked once a second
SLOW_PEERS = 48  # 48 MiB of partial frames offered, six times MEMORY (before: all held)
IDLE_PEERS = 3
HONEST_MAX = 1.0  # seconds; measured 15 ms


def _unfinished_frame() -> bytes:
    """All but the last byte of a frame of exactly ``FRAME`` bytes (the largest allowed)."""
    return struct.pack(">I", FRAME - 4) + bytes(FRAME - 5)


async def _closed_at(conn: RawConnection, start: float, within: float) -> float | None:
    """Seconds from ``start`` until the bookie closed ``conn`` (None: not within ``within``)."""
    if await conn.closed_by_peer(within):
        return time.monotonic() - start
    return None


async def _handshake(conn: RawConnection, timeout: float = 5.0) -> None:
    response = await conn.call(HandshakeRequest(conn.next_txn_id(), client_name="idle"), timeout)
    assert isinstance(response, HandshakeResponse)
    assert response.status is StatusCode.EOK


@pytest.mark.timeout(60)
async def test_unfinished_frames_and_silent_peers_are_closed(
    launch: Launch, connect: Connect
) -> None:
    bookie = await launch(
        max_frame_size=FRAME,
        max_connection_memory=MEMORY,
        frame_timeout=FRAME_TIMEOUT,
        connection_idle_timeout=IDLE_TIMEOUT,
        max_connections=SLOW_PEERS + IDLE_PEERS + 8,
    )
    honest = HonestClient(bookie.host, bookie.port)
    async with honest.running():
        await asyncio.sleep(0.3)  # warm-up: the honest client's first requests stay out
        honest.latencies.clear()
        # Bound: MEMORY of partial frames, the frame that crossed it (each in a bytearray that
        # over-allocates by up to an eighth), and 8 MiB of allocator slack.
        bound = MEMORY + 2 * FRAME + 8 * MiB
        with bookie.sampler(bound, bookie.kill_now) as rss:
            idle = [await connect(bookie) for _ in range(IDLE_PEERS)]
            for conn in idle:
                await _handshake(conn)
            idle_since = time.monotonic()
            slow = []
            for _ in range(SLOW_PEERS):
                if rss.limit_hit:
                    break  # the bookie was killed at the bound: the assertion below says so
                conn = await connect(bookie)
                conn.send_bytes(_unfinished_frame())
                with contextlib.suppress(ConnectionError):  # shed while still sending
                    await conn.drain()
                slow.append(conn)
            sent = time.monotonic()
            limit = max(FRAME_TIMEOUT, IDLE_TIMEOUT) + 2 * SWEEP + 1
            slow_closed, idle_closed = await asyncio.gather(
                asyncio.gather(*(_closed_at(conn, sent, limit) for conn in slow)),
                asyncio.gather(*(_closed_at(conn, idle_since, limit) for conn in idle)),
            )
        assert rss.growth <= bound, f"RSS grew {rss.growth / MiB:.0f} MiB"
        stats = await bookie.stats()
        assert not honest.failures, honest.failures[:5]
        assert max(honest.latencies) <= HONEST_MAX, summary(honest.latencies)

    slow_times = [at for at in slow_closed if at is not None]
    assert len(slow_times) == SLOW_PEERS, f"partial frames still held: {slow_closed}"
    shed = [at for at in slow_times if at < FRAME_TIMEOUT - 0.1]
    timed_out = [at for at in slow_times if at >= FRAME_TIMEOUT - 0.1]
    # What stayed under MEMORY lived out its frame_timeout, no longer.
    assert len(timed_out) <= MEMORY // FRAME, slow_times
    assert max(slow_times) <= FRAME_TIMEOUT + SWEEP + 1.0, slow_times
    assert stats["connections_shed"] >= SLOW_PEERS - MEMORY // FRAME, stats
    assert len(shed) >= SLOW_PEERS - MEMORY // FRAME, slow_times
    idle_times = [at for at in idle_closed if at is not None]
    assert len(idle_times) == IDLE_PEERS, f"silent peers still held: {idle_closed}"
    assert min(idle_times) >= IDLE_TIMEOUT - 0.1, idle_times
    assert max(idle_times) <= IDLE_TIMEOUT + SWEEP + 1.0, idle_times
    assert stats["connections_timed_out"] >= len(timed_out) + IDLE_PEERS, stats
    assert stats["connection_bytes_held"] < 64 * 1024, stats
    assert bookie.terminate() == 0, bookie.log_text()


@pytest.mark.timeout(60)
async def test_at_max_connections_the_longest_idle_makes_room_then_new_ones_are_refused(
    launch: Launch, connect: Connect
) -> None:
    cap = 6
    bookie = await launch(max_connections=cap, connection_idle_timeout=60.0)
    honest = HonestClient(bookie.host, bookie.port)
    async with honest.running():
        assert honest.conn is not None
        # A client with a long poll waiting is never idle (it would lose the poll).
        watch = ReadRequest(
            honest.conn.next_txn_id(), HONEST_LEDGER, 1, ReadFlag.LONG_POLL, b"", 1_000, 30_000
        )
        watching = honest.conn.send(watch, 60.0)
        oldest = await connect(bookie)
        await _handshake(oldest)
        await asyncio.sleep(0.3)  # idle longest by far: idleness is time
        others = [await connect(bookie) for _ in range(cap - 2)]
        for conn in others:
            await _handshake(conn)
        # At the cap: the newcomer is served and the oldest idle peer is closed for it.
        newcomer = await connect(bookie)
        await _handshake(newcomer)
        assert await oldest.closed_by_peer(2.0), "the longest-idle connection was kept"
        # Now no one is idle: each holds a long poll. The next newcomer is refused at once.
        busy = [*others, newcomer]
        for conn in busy:
            conn.send(
                ReadRequest(
                    conn.next_txn_id(), HONEST_LEDGER, 1, ReadFlag.LONG_POLL, b"", 1_000, 30_000
                )
            )

        async def registered() -> bool:  # asked on a busy connection: no room for another
            waiting = (await busy[-1].stats())["long_polls_waiting"]
            return waiting >= len(busy) + 1  # and the honest client's watch

        await wait_until(registered, timeout=10, what="every long poll waiting")
        refused = await connect(bookie)
        refused.send(HandshakeRequest(refused.next_txn_id(), client_name="one too many"))
        assert await refused.closed_by_peer(2.0), "a connection past the cap was served"
        assert not refused.received, "a refused connection got an answer"
        for conn in busy:
            assert not conn.eof, "a busy connection was closed to make room"
        latencies = list(honest.latencies)
        assert not honest.failures, honest.failures[:5]
        assert max(latencies) <= HONEST_MAX, summary(latencies)
        watching.cancel()
    for conn in busy:
        conn.abort()
    stats: dict[str, int] = {}

    async def room() -> bool:  # room again once they are gone
        try:
            stats.update(await bookie.stats())
        except ConnectionError:
            return False
        return True

    await wait_until(room, every=0.1, timeout=10, what="room after the busy peers left")
    assert stats["connections_evicted"] >= 1, stats
    assert stats["connections_refused"] >= 1, stats
    assert bookie.terminate() == 0, bookie.log_text()
