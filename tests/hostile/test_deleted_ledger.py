"""A ledger garbage collection dropped stays dropped.

Before the fix, a live writer's next append into a ledger that had been deleted and garbage
collected was acknowledged: the bookie met an add for a ledger it did not hold and created it
again, so the writer was told its entry was durable in a ledger no reader could ever open. Now
the bookie keeps the ids GC dropped (in FULL index segments) and answers ENOLEDGER to adds and
fencing reads of them, across restarts; the client fails the handle instead of replacing the
bookie (which would recreate the ledger elsewhere).
"""

from __future__ import annotations

import asyncio

import pytest

from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess
from aiobk.protocol import GcRequest, GcResponse, ReadFlag, ReadRequest, StatusCode, master_key
from aiobk.protocol.errors import BKError, NoSuchLedgerError
from tests.hostile.conftest import Connect, Launch
from tests.hostile.harness import BookieUnderTest
from tests.hostile.honest import add_request
from tests.support.names import unique_name

PASSWORD = b"deleted-ledger"


async def _refused(connect: Connect, bookie: BookieUnderTest, ledger_id: int, entry: int) -> None:
    """An add and a fencing read of the dropped ledger, straight to the bookie: ENOLEDGER."""
    conn = await connect(bookie)
    key = master_key(PASSWORD)
    added = await conn.call(add_request(conn.next_txn_id(), ledger_id, entry, b"late", key=key))
    assert added.status is StatusCode.ENOLEDGER, added
    fenced = await conn.call(ReadRequest(conn.next_txn_id(), ledger_id, -1, ReadFlag.FENCE, key))
    assert fenced.status is StatusCode.ENOLEDGER, fenced
    conn.close()


@pytest.mark.timeout(90)
async def test_a_writer_cannot_append_to_a_ledger_gc_dropped(
    launch: Launch, connect: Connect, etcd_server: EtcdProcess
) -> None:
    uri = etcd_server.uri(unique_name("hostile-deleted"))
    bookie = await launch(args=("--metadata", uri), gc_interval=0.0)
    writer = await BookKeeper.connect(uri)
    admin = await BookKeeper.connect(uri)
    try:
        handle = await writer.create_ledger(1, 1, 1, password=PASSWORD)
        for index in range(3):
            assert await handle.append(b"before %d" % index) == index

        await admin.delete_ledger(handle.ledger_id, force=True)  # an operator
        conn = await connect(bookie)
        gc = await conn.call(GcRequest(conn.next_txn_id()), 30)
        assert isinstance(gc, GcResponse), gc
        assert gc.status is StatusCode.EOK, gc
        assert gc.ledgers_deleted == 1, gc

        # The writer never heard of the deletion; its next append must not be acknowledged.
        # The bookie's ENOLEDGER fails the handle (no ensemble change: a replacement bookie
        # would create the ledger again).
        try:
            async with asyncio.timeout(30):
                acknowledged = await handle.append(b"into the void")
        except BKError as exc:
            refusal: BKError = exc
        else:
            pytest.fail(f"entry {acknowledged} acknowledged in a deleted ledger")
        assert isinstance(refusal, NoSuchLedgerError), repr(refusal)
        await _refused(connect, bookie, handle.ledger_id, 3)
    finally:
        await writer.close()
        await admin.close()

    assert bookie.terminate() == 0, bookie.log_text()
    await bookie.start()
    await _refused(connect, bookie, handle.ledger_id, 4)
    assert bookie.terminate() == 0, bookie.log_text()
