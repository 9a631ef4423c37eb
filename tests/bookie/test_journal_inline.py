"""Where the journal writes a batch: volatile batches on the event loop while the file
has room and such writes stay quick, else on its thread. Real files; a wrapper counts writes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiobk.bookie import OsDisk
from aiobk.bookie.disk import AppendFile
from aiobk.bookie.index.twin import TwinIndex
from aiobk.bookie.journal.format import RecordType
from aiobk.bookie.journal.journal import SLOW_WRITE, SLOW_WRITE_BATCHES, Journal
from aiobk.bookie.journal.policy import GroupCommitPolicy
from aiobk.bookie.stats import BookieStats
from tests.bookie.helpers import append_records
from tests.support.append_file import DelegatingAppendFile


class _Counted(DelegatingAppendFile):
    """An append file whose writes are counted by where they ran; ``room`` may be overridden,
    and a write on the loop may be made to look slow (the clock jumps while it runs)."""

    def __init__(self, inner: AppendFile, owner: _CountingDisk) -> None:
        super().__init__(inner)
        self._owner = owner

    @property
    def room(self) -> int:
        forced = self._owner.room
        return self._inner.room if forced is None else forced

    async def write(self, data: bytes) -> None:
        self._owner.lane_writes += 1
        await self._inner.write(data)

    def write_and_sync_now(self, data: bytes) -> None:
        self._owner.synced_here += 1
        self._inner.write_and_sync_now(data)

    def write_now(self, data: bytes) -> None:
        self._owner.loop_writes += 1
        self._owner.now += self._owner.slow_by
        self._owner.slow_by = 0.0
        self._inner.write_now(data)


class _CountingDisk(TwinIndex, OsDisk):
    def __init__(self) -> None:
        super().__init__()
        self.lane_writes = self.loop_writes = self.synced_here = 0
        self.room: int | None = None
        self.now = 0.0  # the journal's clock: moves only when a write is made to look slow
        self.slow_by = 0.0

    async def open_append(
        self, path: str, lane: str, sync_lane: str | None = None, preallocate: int = 0
    ) -> AppendFile:
        return _Counted(await super().open_append(path, lane, sync_lane, preallocate), self)


async def _started(path: Path, disk: _CountingDisk) -> Journal:
    stats = BookieStats()
    stats.clock = lambda: disk.now
    journal = Journal(disk, str(path), GroupCommitPolicy(), max_file_size=1 << 24, stats=stats)
    await journal.replay(-1, lambda record: None)
    await journal.start()
    return journal


async def _replayed(path: Path) -> list[bytes]:
    disk = OsDisk()
    journal = Journal(disk, str(path), GroupCommitPolicy(), max_file_size=1 << 24)
    seen: list[bytes] = []
    await journal.replay(-1, lambda record: seen.append(record.payload))
    await disk.close()
    return seen


async def _load(journal: Journal, rounds: int) -> list[bytes]:
    """``rounds`` of 50 BP-14 volatile records appended together (each answered once written,
    then synced): a batch of many records each round."""
    loop = asyncio.get_running_loop()
    payloads = []
    for index in range(rounds):
        batch = [b"%d-%d" % (index, i) * 20 for i in range(50)]
        written, synced = [], []
        for payload in batch:
            answered: asyncio.Future[BaseException | None] = loop.create_future()
            durable: asyncio.Future[BaseException | None] = loop.create_future()
            journal.append(RecordType.ADD, payload, durable.set_result, answered.set_result)
            written.append(answered)
            synced.append(durable)
        assert await asyncio.gather(*written, *synced) == [None] * 100
        payloads += batch
    return payloads


async def test_volatile_batches_are_written_on_the_loop_and_persistent_ones_on_the_thread(
    tmp_path: Path,
) -> None:
    disk = _CountingDisk()
    journal = await _started(tmp_path, disk)
    payloads = await _load(journal, 20)
    assert disk.loop_writes >= 20
    assert disk.lane_writes == 0
    persistent = [b"p%d" % i for i in range(50)]
    assert await append_records(journal, persistent) == [None] * 50
    assert disk.lane_writes >= 1  # the sync stage's fdatasync overlaps the next write there
    await journal.stop()
    await disk.close()
    assert await _replayed(tmp_path) == [*payloads, *persistent]


async def test_a_batch_the_file_has_no_room_for_is_written_on_the_thread(
    tmp_path: Path,
) -> None:
    """Making room is a zero-fill and an fsync: never on the loop, not even for a lone
    record of an idle journal."""
    disk = _CountingDisk()
    disk.room = 0
    journal = await _started(tmp_path, disk)
    payloads = await _load(journal, 5)
    lone = await append_records(journal, [b"lone"])  # an idle journal's lone persistent record
    await journal.stop()
    await disk.close()
    assert lone == [None]
    assert disk.loop_writes == 0
    assert disk.synced_here == 0
    assert disk.lane_writes >= 6
    assert await _replayed(tmp_path) == [*payloads, b"lone"]


async def test_a_slow_write_on_the_loop_sends_the_next_batches_to_the_thread(
    tmp_path: Path,
) -> None:
    disk = _CountingDisk()
    journal = await _started(tmp_path, disk)
    await _load(journal, 2)
    assert disk.lane_writes == 0
    disk.slow_by = SLOW_WRITE * 2  # the next write here takes that long
    await _load(journal, 3)
    loop_writes = disk.loop_writes
    assert disk.lane_writes >= 2  # the rounds after the slow one
    await _load(journal, SLOW_WRITE_BATCHES)  # a batch a round: the backoff runs out
    assert disk.lane_writes <= SLOW_WRITE_BATCHES + 1
    assert disk.loop_writes > loop_writes  # and the loop writes again
    await journal.stop()
    await disk.close()
