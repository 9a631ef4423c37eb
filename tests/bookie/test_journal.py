"""The journal on real files: group commit, rollover, release, replay, torn and bad records."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from aiobk.bookie import JournalCorruptError, OsDisk
from aiobk.bookie.journal.format import FILE_HEADER, Record, RecordType
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.journal.policy import GroupCommitPolicy
from aiobk.bookie.stats import BookieStats
from tests.bookie.helpers import append_records
from tests.support.wait import wait_until


def _journal(path: Path, disk: OsDisk, **kw: object) -> Journal:
    policy = kw.pop("policy", GroupCommitPolicy())
    return Journal(disk, str(path), policy, max_file_size=kw.pop("max_file_size", 1 << 20), **kw)  # type: ignore[arg-type]


async def _replay(path: Path, after: int = -1) -> tuple[Journal, list[Record]]:
    disk = OsDisk()
    journal = _journal(path, disk)
    seen: list[Record] = []
    await journal.replay(after, seen.append)
    await disk.close()
    return journal, seen


async def test_one_fdatasync_serves_many_records(tmp_path: Path) -> None:
    disk = OsDisk()
    stats = BookieStats()
    journal = _journal(tmp_path, disk, stats=stats)
    await journal.replay(-1, lambda r: None)
    await journal.start()
    results = await append_records(journal, [b"%d" % i for i in range(300)])
    assert results == [None] * 300
    assert stats.journal_records == 300
    assert stats.journal_syncs < 100
    await journal.stop()
    await disk.close()
    _, seen = await _replay(tmp_path)
    assert [r.payload for r in seen] == [b"%d" % i for i in range(300)]
    assert [r.lsn for r in seen] == list(range(300))


async def test_group_wait_delays_a_lone_record_when_asked(tmp_path: Path) -> None:
    disk = OsDisk()
    policy = GroupCommitPolicy(0.05, 1 << 20, flush_when_queue_empty=False)
    journal = _journal(tmp_path, disk, policy=policy)
    await journal.replay(-1, lambda r: None)
    await journal.start()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await append_records(journal, [b"x"])
    assert loop.time() - started >= 0.045
    await journal.stop()
    await disk.close()


async def test_volatile_records_wait_for_a_shared_fdatasync(tmp_path: Path) -> None:
    """BP-14: volatile records are answered once written; their sync waits for company (up to
    the delay), and a persistent record, a barrier or a stop syncs them at once."""
    disk = OsDisk()
    stats = BookieStats()
    journal = _journal(tmp_path, disk, stats=stats, volatile_sync_delay=0.3)
    await journal.replay(-1, lambda r: None)
    await journal.start()
    loop = asyncio.get_running_loop()
    written: list[int] = []
    synced: list[int] = []

    async def volatile(tag: int) -> None:
        answered = loop.create_future()

        def on_written(error: BaseException | None) -> None:
            written.append(tag)
            answered.set_result(error)

        journal.append(RecordType.ADD, b"v%d" % tag, lambda e: synced.append(tag), on_written)
        assert await answered is None

    started = loop.time()
    for tag in range(20):  # one at a time, as an idle writer sends them
        await volatile(tag)
    assert written == list(range(20))
    assert synced == []  # written, not yet synced: no fdatasync per add
    syncs = stats.journal_syncs
    await wait_until(lambda: bool(synced), every=0.01, timeout=10, what="the delayed sync")
    assert synced == list(range(20))
    assert loop.time() - started >= 0.29  # the delay ran out: one fdatasync for the twenty
    assert stats.journal_syncs == syncs + 1

    for tag in range(20, 25):
        await volatile(tag)
    assert await append_records(journal, [b"persistent"]) == [None]  # its fdatasync covers them
    assert synced == list(range(25))

    await volatile(25)
    barrier = loop.create_future()
    journal.barrier(barrier.set_result)  # force(): everything written so far, now
    assert await asyncio.wait_for(barrier, 0.2) is None
    assert synced == list(range(26))

    await volatile(26)
    await journal.stop()  # a clean stop syncs what waits
    assert synced == list(range(27))
    await disk.close()


async def test_rollover_release_and_replay_from_a_mark(tmp_path: Path) -> None:
    disk = OsDisk()
    journal = _journal(tmp_path, disk, max_file_size=4096)
    await journal.replay(-1, lambda r: None)
    await journal.start()
    for _start in range(0, 400, 40):
        await append_records(journal, [b"p" * 100] * 40)
    assert len(journal.files) > 5
    removed = await journal.release(199)
    assert removed > 0
    await journal.stop()
    await disk.close()
    reopened, seen = await _replay(tmp_path, after=199)
    assert [r.lsn for r in seen] == list(range(200, 400))
    assert reopened.next_lsn == 400


async def test_barrier_waits_for_earlier_records(tmp_path: Path) -> None:
    disk = OsDisk()
    journal = _journal(tmp_path, disk)
    await journal.replay(-1, lambda r: None)
    await journal.start()
    order: list[str] = []
    done = asyncio.Event()
    journal.append(RecordType.ADD, b"a", lambda e: order.append("add"))
    journal.barrier(lambda e: (order.append("barrier"), done.set()))
    await asyncio.wait_for(done.wait(), 5)
    assert order == ["add", "barrier"]
    await journal.stop()
    await disk.close()


async def _write_file(tmp_path: Path, count: int) -> Path:
    disk = OsDisk()
    journal = _journal(tmp_path, disk)
    await journal.replay(-1, lambda r: None)
    await journal.start()
    await append_records(journal, [b"record-%03d" % i for i in range(count)])
    await journal.stop()
    await disk.close()
    (path,) = tmp_path.glob("*.txn")
    return path


async def test_torn_tail_is_dropped_and_truncated(tmp_path: Path) -> None:
    path = await _write_file(tmp_path, 10)
    data = bytearray(path.read_bytes())
    end = len(data.rstrip(b"\0"))  # records end here; the rest is zero-filled ahead
    torn = b"\xb0\x0c\x01\x00\x00\x00\x40" + b"\x07" * 9  # a record cut short
    data[end : end + len(torn)] = torn
    path.write_bytes(bytes(data))
    journal, seen = await _replay(tmp_path)
    assert len(seen) == 10
    assert journal.next_lsn == 10
    assert path.stat().st_size <= end  # cut back to the last whole record before the tear


async def test_zero_filled_end_is_a_clean_end(tmp_path: Path) -> None:
    path = await _write_file(tmp_path, 10)
    size = path.stat().st_size
    assert size >= 4 * 1024 * 1024  # preallocated
    _journal, seen = await _replay(tmp_path)
    assert len(seen) == 10
    assert path.stat().st_size == size  # nothing torn, nothing truncated


async def test_damaged_record_followed_by_good_ones_refuses(tmp_path: Path) -> None:
    path = await _write_file(tmp_path, 10)
    data = bytearray(path.read_bytes())
    data[FILE_HEADER.size + 25] ^= 0xFF  # inside the first record; nine good ones follow
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError, match="followed by a valid one"):
        await _replay(tmp_path)


async def test_missing_records_refuse(tmp_path: Path) -> None:
    await _write_file(tmp_path, 10)
    with pytest.raises(JournalCorruptError, match="missing"):
        await _replay(tmp_path, after=-5)  # pretends records -4..-1 existed somewhere


async def test_stale_empty_file_is_replaced(tmp_path: Path) -> None:
    await _write_file(tmp_path, 3)
    (tmp_path / f"{3:016x}.txn").write_bytes(b"")  # a boot that died creating its file
    journal, seen = await _replay(tmp_path)
    assert len(seen) == 3
    assert not os.path.exists(tmp_path / f"{3:016x}.txn")
    assert journal.next_lsn == 3


async def _two_batches(tmp_path: Path) -> tuple[Path, tuple[int, int] | None, int]:
    """Ten records, a checkpoint's (position, mark) taken, five more records; the file."""
    disk = OsDisk()
    journal = _journal(tmp_path, disk)
    await journal.replay(-1, lambda r: None)
    await journal.start()
    await append_records(journal, [b"old-%03d" % i for i in range(10)])
    start, mark = journal.position(), journal.last_lsn
    await append_records(journal, [b"new-%03d" % i for i in range(5)])
    end = journal.position()
    await journal.stop()
    assert journal.position() == end  # a stopped journal's final checkpoint takes its end
    await disk.close()
    (path,) = tmp_path.glob("*.txn")
    return path, start, mark


async def _replay_from(
    path: Path, after: int, start: tuple[int, int] | None
) -> tuple[Journal, list[Record]]:
    disk = OsDisk()
    journal = _journal(path, disk)
    seen: list[Record] = []
    await journal.replay(after, seen.append, start)
    await disk.close()
    return journal, seen


async def test_replay_starts_reading_where_the_checkpoint_says(tmp_path: Path) -> None:
    """A restart reads the journal from the position recorded with the mark, not the whole
    file (whose covered records may be half a gigabyte): the records before it are not read
    at all -- damaged here, which a whole read refuses."""
    path, start, mark = await _two_batches(tmp_path)
    assert start is not None
    assert start[1] > FILE_HEADER.size
    data = bytearray(path.read_bytes())
    data[FILE_HEADER.size + 25] ^= 0xFF  # inside the first record, before the position
    path.write_bytes(bytes(data))
    journal, seen = await _replay_from(tmp_path, mark, start)
    assert [r.payload for r in seen] == [b"new-%03d" % i for i in range(5)]
    assert journal.next_lsn == 15
    with pytest.raises(JournalCorruptError, match="followed by a valid one"):
        await _replay_from(tmp_path, mark, None)


@pytest.mark.parametrize("offset", [FILE_HEADER.size + 3, 1 << 30])
async def test_a_position_where_no_record_begins_reads_the_whole_file(
    tmp_path: Path, offset: int
) -> None:
    """A recorded position that is not a record boundary (inside a record, past the end) is
    only a missed shortcut: the file is read from its start, and nothing is cut."""
    path, _start, mark = await _two_batches(tmp_path)
    size = path.stat().st_size
    journal, seen = await _replay_from(tmp_path, mark, (0, offset))
    assert [r.payload for r in seen] == [b"new-%03d" % i for i in range(5)]
    assert journal.next_lsn == 15
    assert path.stat().st_size == size


async def test_a_position_naming_another_file_is_ignored(tmp_path: Path) -> None:
    _path, start, mark = await _two_batches(tmp_path)
    assert start is not None
    _journal, seen = await _replay_from(tmp_path, mark, (start[0] + 99, start[1]))
    assert len(seen) == 5
