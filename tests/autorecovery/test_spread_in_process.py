"""Autorecovery keeps copies spread over racks, with real bookies in process (memory store):
ledgers written while only one rack's bookies were registered hold every copy there; once the
other racks' bookies register, the auditor marks them for their placement (the explanation says
so) and the workers move one copy of each short write set to another rack, until every write set
spans two racks and reads back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.autorecovery import AutoRecovery, explain_ledger
from aiobk.autorecovery.explain import model as m
from aiobk.client import BookKeeper
from aiobk.client.placement import Spread, spread_of
from aiobk.metadata import PLACEMENT, MetadataStore
from tests.autorecovery.helpers import FAST, assert_copies
from tests.support.cluster import Cluster, forget, start_cluster
from tests.support.wait import wait_until

ENTRIES = 20


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 0, **FAST)
    try:
        yield cluster
    finally:
        await cluster.stop()
        forget(cluster)


async def _racks(store: MetadataStore) -> dict[str, str]:
    return {info.bookie_id: info.rack for info in await store.list_bookies()}


async def _spans(store: MetadataStore, ids: list[int]) -> list[int]:
    """The fewest racks any write set of each ledger spans."""
    spread = Spread(await _racks(store))
    out = []
    for ledger_id in ids:
        metadata = await store.read_ledger(ledger_id)
        out.append(
            min(spread_of(f.ensemble, metadata.write_quorum, spread)[0] for f in metadata.fragments)
        )
    return out


@pytest.mark.timeout(90)
async def test_ledgers_placed_on_one_rack_are_spread_once_the_racks_are_back(
    cluster: Cluster,
) -> None:
    for _ in range(3):
        await cluster.add_bookie(rack="/z/a")
    async with BookKeeper(cluster.uri) as bk:
        store = bk.store
        await store.autorecovery.set_enabled(False)  # marks stay put until looked at
        ids = []
        shapes = [(3, 3, 2), (3, 2, 2), (3, 3, 2)]
        for e, wq, aq in shapes:
            lh = await bk.create_ledger(ensemble_size=e, write_quorum=wq, ack_quorum=aq)
            for i in range(ENTRIES):
                await lh.append(b"entry %d" % i)
            await lh.close()
            ids.append(lh.ledger_id)
        assert await _spans(store, ids) == [1, 1, 1]

        # One rack only: nothing can spread them, and the auditor marks nothing.
        async def checked() -> bool:
            status = await store.autorecovery.read_status()
            return status is not None and status.last_bookie_check != 0

        await wait_until(checked, timeout=20, every=0.1, what="the auditor's bookie check")
        assert [mark async for mark in store.autorecovery.marks()] == []

        for rack in ("/z/b", "/z/b", "/z/c"):
            await cluster.add_bookie(rack=rack)

        async def all_marked() -> bool:
            return len([mark async for mark in store.autorecovery.marks()]) >= len(ids)

        # The registry's racks changed: the walk runs at once.
        await wait_until(all_marked, timeout=30, every=0.1, what="every ledger marked")
        for ledger_id in ids:
            mark = await store.autorecovery.read_mark(ledger_id)
            assert mark is not None
            assert mark.reasons == (PLACEMENT,)
            assert mark.missing == ()
            explanation = await explain_ledger(store, ledger_id)
            assert explanation.status == m.UNDER_REPLICATED
            assert not explanation.under_replicated
            assert explanation.blockers[0].kind == m.MISPLACED
            assert "marked for its placement" in explanation.summary
            assert any("(placement)" in line for line in explanation.lines())

        await store.autorecovery.set_enabled(True)

        async def spread_and_unmarked() -> bool:
            marks = [mark async for mark in store.autorecovery.marks()]
            return (await _spans(store, ids)) == [2, 2, 2] and not marks

        await wait_until(
            spread_and_unmarked, timeout=45, every=0.2, what="every ledger spread, no mark left"
        )
        stats = [
            c.stats for b in cluster.bookies for c in b.companions if isinstance(c, AutoRecovery)
        ]
        assert sum(s.placement_moves for s in stats) >= len(ids)
        assert sum(s.ledgers_marked_for_placement for s in stats) == len(ids)
        for index, ledger_id in enumerate(ids):
            await assert_copies(bk, ledger_id)
            explanation = await explain_ledger(store, ledger_id)
            assert explanation.status == m.HEALTHY, (index, explanation.summary)
