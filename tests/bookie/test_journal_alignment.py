"""Journal alignment on real files: what a group commit is padded to, and journals written at
another alignment read back -- a restart after an upgrade replays what the old default wrote
(4 KiB pages), and the bookie writes its new files at the new one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from aiobk.bookie import Bookie, BookieConfig, OsDisk
from aiobk.bookie.journal.format import FILE_HEADER, RECORD_HEADER, Record, RecordType, scan
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.journal.policy import JOURNAL_ALIGNMENT, GroupCommitPolicy
from aiobk.client import BookieConnection
from aiobk.metadata import free_port
from aiobk.protocol import StatusCode, parse_entry
from tests.bookie.helpers import DIGEST, add, append_records, read
from tests.conftest import BookieFactory

OLD_ALIGNMENT = 4096  # what every journal was padded to before the default became a sector
PAYLOAD = 1024


def _journal(path: Path, disk: OsDisk, **kw: int) -> Journal:
    size = kw.pop("max_file_size", 1 << 20)
    return Journal(disk, str(path), GroupCommitPolicy(), max_file_size=size, **kw)


def _offset(journal: Journal) -> int:
    position = journal.position()
    assert position is not None
    return position[1]


async def _lone_adds(journal: Journal, tags: range) -> list[int]:
    """One 1 KiB ADD record at a time, each its own group commit (a bookie at low load);
    the journal bytes each one took, padding included."""
    sizes = []
    for tag in tags:
        before = _offset(journal)
        assert await append_records(journal, [b"%06d" % tag + bytes(PAYLOAD - 6)]) == [None]
        sizes.append(_offset(journal) - before)
    return sizes


def _group_commit_ends(path: Path) -> list[int]:
    """Where each padding record of a journal file ends (each group commit's end)."""
    data = path.read_bytes()
    records, _stop, _why = scan(data[: len(data.rstrip(b"\0"))], FILE_HEADER.size)
    return [r.end for r in records if r.kind is RecordType.PADDING]


def test_the_bookie_setting_defaults_to_the_journal_alignment() -> None:
    assert BookieConfig(data_dir="data").journal_alignment == JOURNAL_ALIGNMENT == 512


async def test_a_lone_add_takes_whole_sectors_not_a_page(tmp_path: Path) -> None:
    """At low load every add is its own group commit: a 1 KiB record (1043 bytes with its
    header) is padded to three 512-byte sectors, 1.5x its payload -- not to a 4 KiB page, 4x."""
    disk = OsDisk()
    journal = _journal(tmp_path, disk)
    await journal.replay(-1, lambda r: None)
    await journal.start()
    sizes = await _lone_adds(journal, range(8))
    await journal.stop()
    await disk.close()
    assert RECORD_HEADER.size + PAYLOAD == 1043
    assert sizes == [1536 - FILE_HEADER.size] + [1536] * 7  # the first starts after the header
    (path,) = tmp_path.glob("*.txn")
    assert all(end % 512 == 0 for end in _group_commit_ends(path))


async def test_a_journal_padded_to_pages_replays_after_the_upgrade(tmp_path: Path) -> None:
    """A journal as the old default wrote it -- every group commit padded to 4 KiB, over two
    files, never checkpointed (a crash) -- replays whole under the new default, from its start
    or from a checkpoint's position inside it; the new files take the new alignment, and a
    second restart replays old and new files alike."""
    disk = OsDisk()
    old = _journal(tmp_path, disk, alignment=OLD_ALIGNMENT, max_file_size=64 * 1024)
    await old.replay(-1, lambda r: None)
    await old.start()
    assert await _lone_adds(old, range(10)) == [4096 - FILE_HEADER.size] + [4096] * 9
    checkpoint, mark = old.position(), old.last_lsn
    assert await append_records(old, [b"batch-%03d" % i for i in range(50)]) == [None] * 50
    await _lone_adds(old, range(10, 30))  # past 64 KiB: a second file
    await old.crash()  # no clean stop: all of it must come back from the journal
    await disk.close()
    files = sorted(tmp_path.glob("*.txn"))
    assert len(files) == 2
    for path in files:
        ends = _group_commit_ends(path)
        assert ends
        assert all(end % OLD_ALIGNMENT == 0 for end in ends)
    expected = (
        [b"%06d" % tag + bytes(PAYLOAD - 6) for tag in range(10)]
        + [b"batch-%03d" % i for i in range(50)]
        + [b"%06d" % tag + bytes(PAYLOAD - 6) for tag in range(10, 30)]
    )

    disk = OsDisk()
    upgraded = _journal(tmp_path, disk)  # the default alignment
    seen: list[Record] = []
    assert await upgraded.replay(-1, seen.append) == len(expected)
    assert [r.payload for r in seen] == expected
    assert [r.lsn for r in seen] == list(range(len(expected)))
    from_checkpoint: list[Record] = []
    await _journal(tmp_path, disk).replay(mark, from_checkpoint.append, checkpoint)
    assert [r.lsn for r in from_checkpoint] == list(range(mark + 1, len(expected)))
    await upgraded.start()
    assert await _lone_adds(upgraded, range(30, 34)) == [1536 - FILE_HEADER.size] + [1536] * 3
    await upgraded.stop()
    await disk.close()

    disk = OsDisk()
    again: list[Record] = []
    await _journal(tmp_path, disk).replay(-1, again.append)
    await disk.close()
    expected += [b"%06d" % tag + bytes(PAYLOAD - 6) for tag in range(30, 34)]
    assert [r.payload for r in again] == expected
    assert [r.lsn for r in again] == list(range(len(expected)))


def _payload(entry: int) -> bytes:
    return b"%08d" % entry + bytes(PAYLOAD - 8)


async def _serves(conn: BookieConnection, ledger: int, entries: range) -> None:
    for entry in entries:
        response = await read(conn, ledger, entry)
        assert response.status is StatusCode.EOK, (entry, response.status)
        assert DIGEST.verify(parse_entry(response.body), ledger, entry) == _payload(entry)


@pytest.mark.timeout(60)
async def test_a_bookie_upgraded_after_a_crash_serves_what_its_old_journal_held(
    tmp_path: Path,
    start_bookie: BookieFactory,
    connect: Callable[[Bookie], Awaitable[BookieConnection]],
) -> None:
    data = tmp_path / "data"
    port = free_port()  # the same address each time: the cookies name it
    old = await start_bookie(data, port=port, journal_alignment=OLD_ALIGNMENT)
    conn = await connect(old)
    for entry in range(20):  # one at a time: each add is a group commit of its own
        assert (await add(conn, 7, entry, _payload(entry), lac=entry - 1)).status is StatusCode.EOK
    await old.crash()  # nothing checkpointed: the adds live in the journal only

    upgraded = await start_bookie(data, port=port)
    assert upgraded.booted.replayed >= 20
    conn = await connect(upgraded)
    await _serves(conn, 7, range(20))
    before = upgraded.stats.journal_bytes
    for entry in range(20, 30):
        assert (await add(conn, 7, entry, _payload(entry), lac=entry - 1)).status is StatusCode.EOK
    assert upgraded.stats.journal_bytes - before <= 10 * 1536  # three sectors each, not a page
    await upgraded.crash()

    again = await start_bookie(data, port=port)
    await _serves(await connect(again), 7, range(30))
