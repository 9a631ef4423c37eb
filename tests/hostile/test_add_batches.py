"""ADD_BATCH from a hostile peer: a batch is bounded (MAX_BATCH_ENTRIES, the frame
limit) and its entries count one by one against the connection's turn, so peers pipelining
the largest batches of the smallest entries do not hold the loop while an honest peer waits."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.protocol import (
    MAX_BATCH_ENTRIES,
    AddBatchRequest,
    AddBatchResponse,
    StatusCode,
    encode,
    pack_bodies,
)
from tests.hostile.conftest import Connect, Launch
from tests.hostile.harness import summary
from tests.hostile.honest import KEY, HonestClient, add_request, entry_body

HONEST_READ = 61
PEERS, BATCHES = 4, 24  # ~98,000 entries of 8 bytes


@pytest.mark.timeout(120)
async def test_bursts_of_the_largest_batches_do_not_stall_other_peers(
    launch: Launch, connect: Connect
) -> None:
    bookie = await launch()
    first = await connect(bookie)
    assert (await first.call(add_request(first.next_txn_id(), HONEST_READ, 0, b"r"))).status is (
        StatusCode.EOK
    )
    peers = [await connect(bookie) for _ in range(PEERS)]
    bursts = []
    for index, peer in enumerate(peers):
        ledger = 100 + index
        frames = []
        for batch in range(BATCHES):
            start = batch * MAX_BATCH_ENTRIES
            bodies = [
                entry_body(ledger, e, b"tinytiny") for e in range(start, start + MAX_BATCH_ENTRIES)
            ]
            request = AddBatchRequest(
                peer.next_txn_id(), ledger, master_key=KEY, bodies=pack_bodies(bodies)
            )
            frames.append(encode(request))
        bursts.append(b"".join(frames))  # encoded before the honest client's clock runs
    honest = HonestClient(
        bookie.host, bookie.port, read_ledger=HONEST_READ, read_entry=0, interval=0.02
    )
    loop = asyncio.get_running_loop()
    async with honest.running():
        await asyncio.sleep(0.3)  # warm-up: the honest client's first reads stay out
        honest.read_latencies.clear()
        sent_at = loop.time()
        for peer, burst in zip(peers, bursts, strict=True):
            peer.send_bytes(burst)
        for peer in peers:
            while len(peer.received) < BATCHES:
                await peer.read_some(60)
        handled = loop.time() - sent_at
        latencies = list(honest.read_latencies)  # its adds wait behind the burst's in the journal
    answers = [r for peer in peers for _at, r in peer.received.values()]
    assert all(isinstance(r, AddBatchResponse) for r in answers)
    assert {(r.status, r.statuses) for r in answers} == {(StatusCode.EOK, b"")}
    stats = await bookie.stats()
    assert stats["adds"] >= PEERS * BATCHES * MAX_BATCH_ENTRIES
    assert not honest.failures, honest.failures[:5]
    assert latencies, f"the honest peer got no answer in the {handled:.2f}s the burst took"
    # All of one connection's batches in one turn would hold an honest read about as long as
    # the whole burst took (no answer at all, measured); a few hundred entries per connection
    # per turn, a fraction (measured: p50 0.13-0.17 s, max 0.18-0.26 s of a 2.0-2.2 s burst).
    assert max(latencies) <= max(1.0, 0.5 * handled), (summary(latencies), f"burst {handled:.2f}s")
    assert bookie.terminate() == 0, bookie.log_text()
