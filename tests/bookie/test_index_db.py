"""One contract for the index engine and its twin (bookie.index.engine): RocksDB (production) and
the log on the Disk seam (the simulator's) pass the same tests, crashes included."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from aiobk.bookie import OsDisk
from aiobk.bookie.index import rocks as index_rocks
from aiobk.bookie.index.engine import IndexBatch, IndexDb
from aiobk.bookie.index.rocks import FAMILIES, RocksIndexDb
from aiobk.bookie.index.twin import FILE, LogIndexDb
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ("rocksdb", "log")
PER_BATCH = 100


async def open_engine(name: str, path: str) -> IndexDb:
    if name == "rocksdb":
        return RocksIndexDb(path, cache_bytes=8 << 20, write_buffer=4 << 20)
    return await LogIndexDb.open(OsDisk(), path)


def key(ledger: int, entry: int) -> bytes:
    return ledger.to_bytes(8, "big") + entry.to_bytes(8, "big")


@pytest.fixture(params=ENGINES)
async def reopen(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], Awaitable[IndexDb]]]:
    """Opens the engine on one directory; each call closes the previous one first."""
    opened: list[IndexDb] = []

    async def again() -> IndexDb:
        if opened:
            await opened.pop().close()
        db = await open_engine(request.param, str(tmp_path / "index"))
        opened.append(db)
        return db

    yield again
    for db in opened:
        await db.close()


async def test_batches_apply_in_order_and_scans_are_sorted(reopen) -> None:
    db = await reopen()
    batch = IndexBatch()
    for ledger in (3, 1, 2):
        for entry in (2, 0, 1):
            batch.put(key(ledger, entry), b"%d.%d" % (ledger, entry))
    batch.delete(key(3, 2))
    batch.put(key(3, 2), b"again")  # later operations of a batch win
    await db.write(batch)
    assert db.get(key(1, 0)) == b"1.0"
    assert db.get(key(3, 2)) == b"again"
    assert db.get(key(9, 9)) is None
    assert [k for k, _v in db.scan(key(1, 0), key(3, 0))] == [
        key(ledger, entry) for ledger in (1, 2) for entry in (0, 1, 2)
    ]
    drop = IndexBatch()
    drop.delete_range(key(2, 0), key(3, 0))  # one ledger's range (garbage collection)
    drop.delete(key(1, 1))
    await db.write(drop)
    left = [k for k, _v in db.scan(key(0, 0), key(10, 0))]
    assert left == [key(1, 0), key(1, 2), key(3, 0), key(3, 1), key(3, 2)]


async def test_a_returned_write_survives_a_reopen(reopen) -> None:
    db = await reopen()
    for ledger in range(5):
        batch = IndexBatch()
        for entry in range(PER_BATCH):
            batch.put(key(ledger, entry), entry.to_bytes(8, "big"))
        await db.write(batch)
    db = await reopen()
    assert len(list(db.scan(key(0, 0), key(5, 0)))) == 5 * PER_BATCH
    assert db.get(key(4, PER_BATCH - 1)) == (PER_BATCH - 1).to_bytes(8, "big")


# Keys under every first byte the RocksDB engine treats alike or apart (rocks.FAMILIES:
# D, E, G and H have column families of their own), and bytes around them.
SPREAD = [bytes([first]) + key(n, 0) for first in b"\x00ADEFGHIMZ\xff" for n in (1, 2)]


async def test_scans_and_range_deletes_cross_key_prefixes_in_order(reopen) -> None:
    db = await reopen()
    batch = IndexBatch()
    for k in reversed(SPREAD):
        batch.put(k, k[:1])
    await db.write(batch)
    assert [k for k, _v in db.scan(b"", b"\xff" * 20)] == SPREAD
    middle = [k for k in SPREAD if b"D\x00" <= k < b"H" + key(2, 0)]
    assert [k for k, _v in db.scan(b"D\x00", b"H" + key(2, 0))] == middle
    drop = IndexBatch()
    drop.delete_range(b"E" + key(2, 0), b"H" + key(2, 0))  # E's last key to H's first
    await db.write(drop)
    left = [k for k in SPREAD if not b"E" + key(2, 0) <= k < b"H" + key(2, 0)]
    db = await reopen()
    assert [k for k, _v in db.scan(b"", b"\xff" * 20)] == left
    assert db.get(b"G" + key(1, 0)) is None
    assert db.get(b"H" + key(2, 0)) == b"H"


def _plain_rocks(path: str, families: bool) -> Rdict:
    """The database as another program (or an older aiobk) would open it."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    named = dict.fromkeys(FAMILIES.values(), options) if families else None
    return Rdict(path, options, column_families=named)


@pytest.mark.parametrize("already_moved", [0, 5])
async def test_an_index_made_before_the_column_families_is_moved_into_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, already_moved: int
) -> None:
    """Every key of an index written with one family (today's before this change) is found
    after opening it, each in its family, once -- also when a crash stopped an earlier move
    after ``already_moved`` keys of E."""
    monkeypatch.setattr(index_rocks, "MOVE_CHUNK", 3)  # several chunks a prefix
    path = str(tmp_path / "index")
    keys = SPREAD + [b"E" + key(1, entry) for entry in range(1, 20)]
    keys.sort()
    moved = [k for k in keys if k[:1] == b"E"][:already_moved]
    if moved:  # what an open that crashed between chunks left: these in the family already
        db = RocksIndexDb(path)
        batch = IndexBatch()
        for k in moved:
            batch.put(k, b"v" + k)
        await db.write(batch)
        await db.close()
    plain = _plain_rocks(path, families=bool(moved))
    for k in keys:
        if k not in moved:
            plain[k] = b"v" + k
    plain.close()
    del plain
    db = RocksIndexDb(path)
    try:
        assert [(k, v) for k, v in db.scan(b"", b"\xff" * 20)] == [(k, b"v" + k) for k in keys]
        assert all(db.get(k) == b"v" + k for k in keys)
    finally:
        await db.close()
    plain = _plain_rocks(path, families=True)
    try:
        it = plain.iter()  # the default family's keys
        it.seek_to_first()
        left = []
        while it.valid():
            left.append(bytes(it.key()))
            it.next()
        del it
        assert left == [k for k in keys if k[0] not in FAMILIES]
    finally:
        plain.close()


def crash_child(name: str, path: str) -> None:
    """Run in a child process: write batches forever, print each one's number once durable."""

    async def run() -> None:
        db = await open_engine(name, path)
        number = 0
        while True:
            batch = IndexBatch()
            for entry in range(PER_BATCH):
                batch.put(key(number, entry), b"x" * 32)
                batch.put(b"E" + key(number, entry), b"y" * 8)  # another column family
            await db.write(batch)
            print(number, flush=True)
            number += 1

    asyncio.run(run())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ENGINES)
async def test_kill_9_keeps_every_durable_batch_whole_and_no_part_of_another(
    name: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "index")
    code = f"from tests.bookie.test_index_db import crash_child; crash_child({name!r}, {path!r})"
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    durable = -1
    for line in child.stdout:
        durable = int(line)
        if durable >= 30:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    db = await open_engine(name, path)
    try:
        for number in range(durable + 1):
            assert len(list(db.scan(key(number, 0), key(number + 1, 0)))) == PER_BATCH
            assert len(list(db.scan(b"E" + key(number, 0), b"E" + key(number + 1, 0)))) == (
                PER_BATCH
            )
        after = len(list(db.scan(key(durable + 1, 0), key(durable + 2, 0))))
        assert after in (0, PER_BATCH)  # the batch being written: all of it or none
        assert len(list(db.scan(b"E" + key(durable + 1, 0), b"E" + key(durable + 2, 0)))) == after
    finally:
        await db.close()


async def test_the_twin_drops_a_torn_last_batch_and_carries_on(tmp_path: Path) -> None:
    """What a crash mid-append leaves on a simulated disk: the earlier batches whole, the torn
    one gone, and the log usable (the next batch lands after the last good one)."""
    path = str(tmp_path / "index")
    db = await LogIndexDb.open(OsDisk(), path)
    for number in range(3):
        batch = IndexBatch()
        batch.put(key(number, 0), b"v")
        await db.write(batch)
    await db.close()
    log = Path(path) / FILE
    whole = log.stat().st_size
    with log.open("r+b") as out:
        out.truncate(whole - 3)  # the last record torn
    db = await LogIndexDb.open(OsDisk(), path)
    assert [db.get(key(n, 0)) for n in range(3)] == [b"v", b"v", None]
    batch = IndexBatch()
    batch.put(key(7, 0), b"after")
    await db.write(batch)
    await db.close()
    db = await LogIndexDb.open(OsDisk(), path)
    assert db.get(key(7, 0)) == b"after"
    assert db.get(key(1, 0)) == b"v"
    await db.close()
    assert os.path.getsize(log) < whole + 64


async def test_rocksdb_says_when_its_background_work_is_done(tmp_path: Path) -> None:
    db = RocksIndexDb(str(tmp_path / "index"), write_buffer=1 << 20)
    try:
        assert db.background_work() == 0
        for number in range(40):  # several memtables' worth: flushes, then a compaction
            batch = IndexBatch()
            for entry in range(2_000):
                batch.put(b"E" + key(number, entry), b"v" * 32)
            await db.write(batch)
        # RocksDB has no event for it: asked every 0.1 s.
        await wait_until(
            lambda: db.background_work() == 0, every=0.1, timeout=30, what="no background work"
        )
    finally:
        await db.close()


def _table_properties(db: RocksIndexDb, family: str) -> dict[str, int]:
    """The numbers of RocksDB's aggregated table properties of ``family`` (``# index
    partitions``, ``filter block size``...)."""
    view = db._db.get_column_family(family)
    text = view.property_value("rocksdb.aggregated-table-properties") or ""
    found: dict[str, int] = {}
    for item in text.split(";"):
        name, _, value = item.partition("=")
        if value.strip().isdigit():
            found[name.split("(")[0].strip()] = int(value)  # "index block size (user-key? 1..."
    return found


async def test_the_entries_family_has_no_filters_and_whole_index_partitions(
    tmp_path: Path,
) -> None:
    """Flushed tables of ledger records and locations carry no bloom filter, so their index
    partitions are cut at ``INDEX_PARTITION_BYTES``, not wherever a filter partition ends (with
    filters: about 2 KiB each, and a cold read loading one more often than not); the
    deleted ledgers, looked up for ids mostly not there, keep theirs."""
    db = RocksIndexDb(str(tmp_path / "index"), write_buffer=32 << 20)
    try:
        for number in range(10):  # 300,000 keys a family, flushed into a table or two
            batch = IndexBatch()
            for entry in range(30_000):
                batch.put(b"E" + key(number, entry), b"v" * 8)
                batch.put(b"D" + key(number, entry), b"")
            await db.write(batch)
        db._db.flush()  # the memtables into tables, to read their figures
        for family in FAMILIES.values():
            db._db.get_column_family(family).flush()
        entries, deleted = _table_properties(db, "entries"), _table_properties(db, "deleted")
        tables = sum(f["start_key"][:1] == b"E" for f in db._db.live_files())
    finally:
        await db.close()
    assert entries["filter block size"] == 0, entries
    # Each table's last partition may be short: the rest are whole (measured: 3 partitions of
    # 44 KB of index in one table; 49 with filters).
    whole = entries["index block size"] / index_rocks.INDEX_PARTITION_BYTES
    assert entries["# index partitions"] <= whole + tables, (entries, tables)
    assert deleted["filter block size"] > 0, deleted


async def test_a_close_whose_last_flush_fails_closes_and_raises_an_os_error(tmp_path: Path) -> None:
    """Its directory gone under it (a failed disk, an operator's rm): the close says so as the
    bookie's disk errors are said, and the database is closed all the same."""
    path = str(tmp_path / "index.db")
    db = await RocksIndexDb.open(path)
    batch = IndexBatch()
    batch.put(key(1, 0), b"x")
    await db.write(batch)
    shutil.rmtree(path)
    with pytest.raises(OSError, match="index database"):
        await db.close()
    again = await RocksIndexDb.open(path)  # not held open: a new one opens there
    await again.close()
