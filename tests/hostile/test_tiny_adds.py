"""Peers flooding the smallest adds at a bookie whose disk has stalled (invariant I16).

``max_add_bytes_in_progress`` bounds what adds waiting for the journal hold. It counted their
bodies only, while each add in progress holds about 1,240 bytes of objects (its request, its
answer's closure, its journal record and callbacks) whatever its body: twelve peers pipelining
10,000 adds of 46-byte bodies each made a bookie capped at 4 MiB hold 127 MB. Each add now
counts its body plus ``ADD_HELD_BYTES``, and frames already read wait as bytes while the bookie
is over its cap (one read from a socket brought thousands: with the charge alone the bookie
still took 15,578 adds, 19.6 MB). Now: 3,164 adds, 5.8 MB.

In process (the bookie's real code and files, on a disk whose journal fdatasyncs wait until
the test lets them go), so that what the bookie holds can be measured with tracemalloc; the
peers are raw sockets whose bytes were encoded before the measurement started."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from pathlib import Path

import pytest

from aiobk.bookie import Bookie, BookieConfig
from aiobk.bookie.flow import ADD_HELD_BYTES
from aiobk.protocol import (
    AddRequest,
    AddResponse,
    FrameDecoder,
    HandshakeRequest,
    HandshakeResponse,
    Response,
    StatusCode,
    decode_response,
    encode,
)
from tests.bookie.helpers import KEY, body
from tests.support.faulty_disk import FaultyDisk
from tests.support.wait import wait_until

CAP = 4 << 20
PEERS, ADDS = 12, 10_000  # over the per-connection in-flight cap (10,000) all together
PAYLOAD = b"x" * 8  # a 46-byte body with its header


def _flood(peer: int) -> bytes:
    frames = bytearray(encode(HandshakeRequest(0)))
    ledger = 100 + peer
    for entry in range(ADDS):
        payload = body(ledger, entry, PAYLOAD)
        frames += encode(AddRequest(entry + 1, ledger, entry, master_key=KEY, body=payload))
    return bytes(frames)


@pytest.mark.timeout(120)
async def test_a_flood_of_tiny_adds_holds_about_the_cap(tmp_path: Path) -> None:
    disk = FaultyDisk()
    config = BookieConfig(
        data_dir=str(tmp_path / "b"), port=0, max_add_bytes_in_progress=CAP, max_frame_size=1 << 20
    )
    bookie = Bookie(config, disk=disk)
    await bookie.start()
    floods = [_flood(peer) for peer in range(PEERS)]
    gate = disk.sync_gate = asyncio.Event()
    peers: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for flood in floods:
                reader, writer = await asyncio.open_connection(*bookie.address)
                writer.write(flood)
                peers.append((reader, writer))
            flow = bookie.context.flow
            received = [-1]

            def stopped() -> bool:  # paused, and no add taken since the last look
                adds, received[0] = received[0], bookie.stats.adds
                return flow.adds_paused and bookie.stats.adds == adds

            await wait_until(stopped, timeout=20, what="the bookie stopped taking adds")
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gate.set()
        held = bookie.stats.adds
        figures = f"{held} adds in progress hold {grown / 1e6:.1f} MB (paused: {flow.adds_paused})"
        assert flow.adds_paused, figures
        # Stopped at the cap: the add that went over it is the last one taken.
        charge = len(body(0, 0, PAYLOAD)) + ADD_HELD_BYTES
        assert held * charge <= CAP + charge, figures
        # What the held adds cost in memory stays near the cap (it was 30x over it).
        assert grown <= 3 * CAP, figures
        # Once the disk moves again every add is answered, in order: none lost or refused.
        for reader, _writer in peers:
            answers = await asyncio.wait_for(_answers(reader, 1 + ADDS), 60)
            assert isinstance(answers[0], HandshakeResponse)
            adds = answers[1:]
            assert all(isinstance(a, AddResponse) and a.status is StatusCode.EOK for a in adds)
            assert [a.entry_id for a in adds if isinstance(a, AddResponse)] == list(range(ADDS))
    finally:
        gate.set()
        for _reader, writer in peers:
            writer.close()
        await asyncio.wait_for(bookie.stop(), 30)


async def _answers(reader: asyncio.StreamReader, count: int) -> list[Response]:
    frames = FrameDecoder()
    answers: list[Response] = []
    while len(answers) < count:
        data = await reader.read(1 << 16)
        assert data, "the bookie closed the connection"
        answers += [decode_response(frame) for frame in frames.feed(data)]
    return answers
