"""Entry locations and ledger state over the index engine, with its write cache
(bookie.index.entry_index), on the simulator's twin (the engine contract is test_index_db.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.bookie import OsDisk
from aiobk.bookie.index.engine import IndexBatch, IndexCorruptError
from aiobk.bookie.index.entry_index import (
    MARK_KEY,
    VALUE,
    EntryIndex,
    LedgerRecord,
    check_layout,
    ledger_range,
    location_key,
    state_key,
)
from aiobk.bookie.index.twin import LogIndexDb


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[EntryIndex]:
    db = await LogIndexDb.open(OsDisk(), str(tmp_path / "index"))
    yield EntryIndex(db, max_cache_bytes=400)  # five cached locations
    await db.close()


async def _reopened(index: EntryIndex, tmp_path: Path) -> EntryIndex:
    await index.db.close()
    return EntryIndex(await LogIndexDb.open(OsDisk(), str(tmp_path / "index")))


async def test_cached_then_flushed_with_the_mark_and_durable(
    index: EntryIndex, tmp_path: Path
) -> None:
    record = LedgerRecord(b"k" * 20, fenced=True, lac=4, max_entry=5)
    for entry in range(6):
        index.cache.put_location(7, entry, 1000 + entry)
    index.cache.put_state(7, record)
    assert index.location(7, 3) == 1003  # from the cache
    assert index.mark() == -1
    assert index.cache.full  # six cached locations pass this index's bound
    await index.flush(mark=42)
    assert index.cache.memory == 0
    again = await _reopened(index, tmp_path)
    assert again.mark() == 42
    assert again.location(7, 5) == 1005
    assert again.location(7, 6) == -1
    assert again.state(7) == record
    assert list(again.entries(7)) == [(e, 1000 + e) for e in range(6)]
    assert list(again.ledgers()) == [7]
    await again.db.close()


async def test_newer_changes_win_and_a_deleted_ledger_is_gone_everywhere(
    index: EntryIndex,
) -> None:
    index.cache.put_location(1, 0, 10)
    index.cache.put_location(2, 0, 20)
    index.cache.put_state(1, LedgerRecord(b"a"))
    index.cache.put_state(2, LedgerRecord(b"b"))
    await index.flush(mark=1)
    index.cache.put_location(1, 0, 11)  # compaction moved it: the cached one wins
    index.cache.put_location(1, 1, 12)
    index.cache.delete_ledger(2)
    assert index.location(1, 0) == 11
    assert index.location(2, 0) == -1
    assert index.state(2) is None
    assert list(index.ledgers()) == [1]
    assert list(index.entries(1)) == [(0, 11), (1, 12)]
    await index.flush(mark=2)
    assert index.location(2, 0) == -1
    assert list(index.entries(2)) == []
    assert list(index.ledgers()) == [1]


async def test_a_flush_being_written_is_still_seen(index: EntryIndex) -> None:
    index.cache.put_location(3, 0, 30)
    flushing = asyncio.ensure_future(index.flush(mark=5))
    await asyncio.sleep(0)  # the cache is set aside, the write under way
    index.cache.put_location(3, 1, 31)  # goes to a fresh cache
    assert index.location(3, 0) == 30
    assert list(index.entries(3)) == [(0, 30), (1, 31)]
    await flushing
    assert index.location(3, 0) == 30
    assert index.cache.memory > 0  # entry 1 waits for the next flush


class _FailingDb(LogIndexDb):
    fail = True

    async def write(self, batch: IndexBatch) -> None:
        if self.fail:
            raise OSError(28, "No space left on device")
        await super().write(batch)


async def test_a_failed_flush_keeps_its_changes_for_the_next(tmp_path: Path) -> None:
    db = await _FailingDb.open(OsDisk(), str(tmp_path / "index"))
    assert isinstance(db, _FailingDb)
    index = EntryIndex(db)
    index.cache.put_location(4, 0, 40)
    index.cache.put_state(4, LedgerRecord(b"k"))
    with pytest.raises(OSError, match="No space"):
        await index.flush(mark=9)
    index.cache.put_location(4, 1, 41)
    assert index.location(4, 0) == 40
    db.fail = False
    await index.flush(mark=10)
    assert index.mark() == 10
    assert list(index.entries(4)) == [(0, 40), (1, 41)]
    assert index.state(4) == LedgerRecord(b"k")
    await db.close()


def test_a_ledgers_record_sorts_just_before_its_entries() -> None:
    """A read loads the ledger's record, then looks up the entry: with the record beside the
    entries a cold read of a small ledger reads one index block, not two (cold reads cost
    one disk read each). Nothing of another ledger falls between."""
    keys = [
        state_key(6),
        location_key(6, (1 << 64) - 1),
        state_key(7),
        location_key(7, 0),
        location_key(7, 1),
        location_key(7, (1 << 64) - 1),
        state_key(8),
    ]
    assert sorted(keys) == keys
    start, end = ledger_range(7)
    assert [k for k in keys if start <= k < end] == keys[2:6]


async def test_ledgers_and_entries_stay_apart_with_records_beside_entries(
    index: EntryIndex,
) -> None:
    for ledger_id in (3, 4, 5):
        for entry in range(3):
            index.cache.put_location(ledger_id, entry, 100 * ledger_id + entry)
        index.cache.put_state(ledger_id, LedgerRecord(b"k", max_entry=2))
    await index.flush(mark=1)
    index.cache.delete_ledger(4)
    await index.flush(mark=2)
    assert list(index.ledgers()) == [3, 5]
    assert list(index.entries(3)) == [(0, 300), (1, 301), (2, 302)]  # not ledger 4's record
    assert list(index.entries(4)) == []
    assert index.state(4) is None
    assert index.is_deleted(4)
    assert index.state(5) == LedgerRecord(b"k", max_entry=2)


async def test_an_index_in_another_key_layout_is_refused(tmp_path: Path) -> None:
    db = await LogIndexDb.open(OsDisk(), str(tmp_path / "index"))
    check_layout(db, "fresh")  # empty: any layout goes
    old = IndexBatch()
    old.put(b"L" + bytes(8), LedgerRecord(b"k").encode())
    old.put(MARK_KEY, VALUE.pack(5))  # layout 1 wrote no layout key
    await db.write(old)
    with pytest.raises(IndexCorruptError, match="key layout 1; this bookie reads layout 2"):
        check_layout(db, "old")
    index = EntryIndex(db)
    await index.flush(mark=6)
    check_layout(db, "written now")
    await db.close()


async def test_a_run_of_locations_ends_before_the_first_entry_not_held(
    index: EntryIndex,
) -> None:
    """``locations`` from the cache while it knows the ledger, from one scan of the engine
    once flushed; either way consecutive from the first entry asked, up to a gap or ``last``."""
    for entry in (*range(10), *range(11, 14)):  # entry 10 is missing
        index.cache.put_location(7, entry, 1000 + entry)
    index.cache.put_location(8, 0, 5)  # the next ledger's entries are not this one's
    cached = index.locations(7, 2, 99)
    assert cached == [1000 + e for e in range(2, 10)]
    await index.flush(mark=1)
    assert index.cache.memory == 0
    assert index.locations(7, 2, 99) == cached
    assert index.locations(7, 0, 4) == [1000 + e for e in range(5)]
    assert index.locations(7, 11, 99) == [1011, 1012, 1013]
    assert index.locations(7, 10, 99) == []
    assert index.locations(9, 0, 9) == []
    index.cache.put_location(7, 10, 1010)  # the cache knows the ledger again
    assert index.locations(7, 8, 12) == [1008, 1009, 1010, 1011, 1012]


@pytest.mark.parametrize(
    "locations",
    [
        [(3 << 40) + 12 + 100 * n for n in range(6)],  # one log
        [(3 << 40) + 5000, (3 << 40) + 5100, (4 << 40) + 12, (4 << 40) + 112],  # rolled
        [(3 << 40) + 12],
        [],
    ],
    ids=["one-log", "rolled", "one", "none"],
)
async def test_a_batchs_locations_count_as_each_entry_on_its_own_would(
    tmp_path: Path, locations: list[int]
) -> None:
    """``put_locations`` (an ADD_BATCH's) leaves the cache, its memory, each log's count of the
    ledger's entries and the index after a flush as ``put_location`` of each entry does."""
    entry_ids = list(range(10, 10 + len(locations)))
    indexes = []
    for name in ("batch", "each"):
        db = await LogIndexDb.open(OsDisk(), str(tmp_path / name))
        index = EntryIndex(db)
        index.cache.put_location(7, 9, (3 << 40) + 1)  # one there before
        if name == "batch":
            index.cache.put_locations(7, entry_ids, locations)
        else:
            for entry_id, location in zip(entry_ids, locations, strict=True):
                index.cache.put_location(7, entry_id, location)
        indexes.append(index)
    batch, each = indexes
    assert batch.pending_log_counts() == each.pending_log_counts()
    assert batch.cache.memory == each.cache.memory == 80 * (1 + len(locations))
    for index in indexes:
        await index.flush(mark=1)
    assert list(batch.entries(7)) == list(each.entries(7))
    for log_id in (3, 4):
        assert list(batch.log_ledgers(log_id)) == list(each.log_ledgers(log_id))
    assert dict(batch.log_ledgers(3)) == {7: 1 + sum(at >> 40 == 3 for at in locations)}
    for index in indexes:
        await index.db.close()
