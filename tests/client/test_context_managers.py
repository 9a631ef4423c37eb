"""``async with BookKeeper(uri) as bk`` and ledger handles as async context managers:
``async with BookKeeper(uri, ...) as bk`` connects on entry, ``LedgerHandle`` is an async
context manager."""

from __future__ import annotations

import pytest

from aiobk.client import BookKeeper, ClientConfig
from aiobk.client.errors import BookieUnavailableError, LedgerClosedError
from aiobk.metadata import LedgerState, MetadataURIError, open_store
from tests.support.cluster import Cluster


async def test_bookkeeper_from_a_uri_connects_on_entry_and_closes_on_exit(
    cluster: Cluster,
) -> None:
    async with BookKeeper(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2)
        assert await lh.append(b"x") == 0
        await lh.close()
    with pytest.raises(BookieUnavailableError, match="client is closed"):
        await bk.pool.get(cluster.bookies[0].bookie_id)  # its connections are gone
    with pytest.raises(RuntimeError, match="closed"):
        async with bk:
            pass
    async with BookKeeper(cluster.uri, ClientConfig(read_timeout=3.0)) as other:
        assert other.config.read_timeout == 3.0
        assert (await other.open_ledger(lh.ledger_id)).last_add_confirmed == 0
    # The older spelling still works.
    async with await BookKeeper.connect(cluster.uri) as bk:
        assert [i async for i in bk.list_ledgers()] == [lh.ledger_id]
    with pytest.raises(MetadataURIError):
        BookKeeper("nope://x")


async def test_a_store_handed_in_stays_open(cluster: Cluster) -> None:
    store = open_store(cluster.uri)
    async with BookKeeper(store) as bk:
        await (await bk.create_ledger(3, 3, 2)).close()
    assert [i async for i in store.list_ledgers()]  # still usable: not the client's to close
    await store.close()


async def test_a_ledger_handle_closes_on_exit(cluster: Cluster) -> None:
    async with BookKeeper(cluster.uri) as bk:
        async with await bk.create_ledger(3, 3, 2) as lh:
            for i in range(3):
                await lh.append(b"%d" % i)
        assert lh.is_closed
        metadata = await bk.store.read_ledger(lh.ledger_id)
        assert metadata.state is LedgerState.CLOSED
        assert metadata.last_entry_id == 2
        with pytest.raises(LedgerClosedError):
            await lh.append(b"late")

        # Leaving on an exception: closed all the same, and that exception propagates.
        failing = await bk.create_ledger(3, 3, 2)

        async def fail_inside() -> None:
            async with failing:
                await failing.append(b"kept")
                raise KeyError("the application's own error")

        with pytest.raises(KeyError):
            await fail_inside()
        assert (await bk.store.read_ledger(failing.ledger_id)).last_entry_id == 0

        async with await bk.open_ledger(lh.ledger_id) as rh:  # harmless: nothing to release
            assert [e.data for e in await rh.read(0, 2)] == [b"0", b"1", b"2"]
        assert [e.data for e in await rh.read(0, 0)] == [b"0"]
