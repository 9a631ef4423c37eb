"""One contract for the index engine and its twin (bookie.index_db): RocksDB (production) and
the log on the Disk seam (the simulator's) pass the same tests, crashes included."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aiobk.bookie import OsDisk
from aiobk.bookie.index_db import IndexBatch, IndexDb
from aiobk.bookie.index_log import FILE, LogIndexDb
from aiobk.bookie.index_rocks import RocksIndexDb

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


def crash_child(name: str, path: str) -> None:
    """Run in a child process: write batches forever, print each one's number once durable."""

    async def run() -> None:
        db = await open_engine(name, path)
        number = 0
        while True:
            batch = IndexBatch()
            for entry in range(PER_BATCH):
                batch.put(key(number, entry), b"x" * 32)
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
        after = len(list(db.scan(key(durable + 1, 0), key(durable + 2, 0))))
        assert after in (0, PER_BATCH)  # the batch being written: all of it or none
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
