"""Entries at far-apart ids must not cost a whole index page each.

Before the fix every entry id in a new 4096-entry range allocated a dense 32 KiB page, in
memory and in every index segment: 3,000 tiny adds at ids a billion apart took +100 MiB of RSS
and 94 MiB of index on disk. Now a page starts sparse (a dict of the slots it holds) and only
turns dense once it holds ``SPARSE_MAX`` entries, and segments write sparse pages slot by slot
(``bookie.upgrade.segments`` format 2).
"""

from __future__ import annotations

import contextlib

import pytest

from aiobk.protocol import ReadRequest, ReadResponse, StatusCode
from tests.hostile.conftest import Connect, Launch
from tests.hostile.harness import MiB
from tests.hostile.honest import add_request, entry_body
from tests.hostile.rawclient import RawConnection
from tests.support.wait import wait_until

LEDGER = 70
ADDS = 3_000
STRIDE = 10**9  # entry ids 0, 1e9, 2e9, ...: every one in a page of its own
PAYLOAD = b"sparse"  # a 42-byte body with its header and digest
# A sparse page of one entry: the page dict and its int objects, a few hundred bytes; 4 KiB
# each leaves room for the entry log's buffers and allocator slack. Before: 32 KiB each.
RSS_BOUND = ADDS * 4096
# A segment spends 30 bytes on a one-entry sparse page (page head and one slot), and a FULL
# and a DELTA segment may both hold them: 64 bytes an entry. Before: 32 KiB.
INDEX_BOUND = ADDS * 64 + 64 * 1024


def _entries() -> list[int]:
    return [i * STRIDE for i in range(ADDS)]


async def _checkpointed(conn: RawConnection, after: int) -> dict[str, int]:
    seen: list[dict[str, int]] = []

    async def checkpointed() -> bool:
        seen.append(await conn.stats())
        return seen[-1]["checkpoints"] > after

    await wait_until(checkpointed, every=0.1, timeout=30, what=f"checkpoint {after + 1}")
    return seen[-1]


@pytest.mark.timeout(60)
async def test_far_apart_entry_ids_cost_little_memory_and_index(
    launch: Launch, connect: Connect
) -> None:
    bookie = await launch(flush_interval=0.3)
    conn = await connect(bookie)
    warm = await conn.call(add_request(conn.next_txn_id(), LEDGER + 1, 0, PAYLOAD))
    assert warm.status is StatusCode.EOK  # journal, entry log and index are open and warm
    index_before = bookie.dir_bytes("ledgers/index")
    with bookie.sampler(RSS_BOUND, bookie.kill_now) as rss:
        txns = conn.send_many(
            add_request(conn.next_txn_id(), LEDGER, entry, PAYLOAD) for entry in _entries()
        )
        with contextlib.suppress(ConnectionError):  # killed at the bound: asserted next
            await conn.wait_for(txns, 30)
    assert rss.growth <= RSS_BOUND, f"RSS grew {rss.growth / MiB:.1f} MiB"
    statuses = {conn.received[txn][1].status for txn in txns}
    assert statuses == {StatusCode.EOK}, statuses
    stats = await _checkpointed(conn, (await conn.stats())["checkpoints"] + 1)
    assert stats["checkpoint_failures"] == 0, stats
    index = bookie.dir_bytes("ledgers/index")
    assert index - index_before <= INDEX_BOUND, f"index grew {index - index_before} bytes"
    assert bookie.terminate() == 0, bookie.log_text()

    await bookie.start()  # the sparse pages load back from the index
    conn = await connect(bookie)
    txns = conn.send_many(ReadRequest(conn.next_txn_id(), LEDGER, entry) for entry in _entries())
    answers = await conn.wait_for(txns, 30)
    for txn, entry in zip(txns, _entries(), strict=True):
        response = answers[txn]
        assert isinstance(response, ReadResponse), response
        assert response.status is StatusCode.EOK, (entry, response)
        assert response.body == entry_body(LEDGER, entry, PAYLOAD)
    assert bookie.terminate() == 0, bookie.log_text()
