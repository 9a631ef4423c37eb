"""Entry reads from the entry logs on disk (bookie.entrylog): whatever a record's size and
wherever it starts in a page -- within the first read, just past it, spanning pages, or bigger
than a page -- it reads back whole and checked, cold or cached."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

from aiobk.bookie import OsDisk
from aiobk.bookie.entrylog.format import PAGE, unpack_location
from aiobk.bookie.entrylog.logger import EntryLogger


async def test_records_of_every_size_at_every_alignment_read_back(tmp_path: Path) -> None:
    rng = random.Random(3)
    # Sizes around the read's bounds (the rest of a page, READ_MIN, a page, two pages).
    sizes = [1, 90, 1000, 1023, 1024, 1025, 3000, 4095, 4096, 4097, 9000]
    sizes += [rng.randrange(1, 6000) for _ in range(300)]
    disk = OsDisk()
    logger = EntryLogger(
        disk, str(tmp_path / "entries"), max_log_size=1 << 30, write_buffer_size=1 << 20
    )
    await logger.open()
    stored = []
    for entry_id, size in enumerate(sizes):
        body = rng.randbytes(size)
        stored.append((logger.append(7, entry_id, body), entry_id, body))
    await logger.sync()
    offsets = {unpack_location(location)[1] % PAGE for location, _, _ in stored}
    assert len(offsets) > 250  # records start all over their pages
    try:
        for cold in (True, False):
            if cold:
                for name in os.listdir(tmp_path / "entries"):
                    fd = os.open(tmp_path / "entries" / name, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
            for location, entry_id, body in stored:
                assert await logger.read(location, 7, entry_id) == body
    finally:
        await logger.close()
        await disk.close()


async def test_a_batch_appends_what_its_entries_one_by_one_would(tmp_path: Path) -> None:
    """``append_many`` (ADD_BATCH's path) writes the same bytes at the same locations as
    ``append`` of each entry, rolling to a new log mid-batch where ``append`` would."""
    rng = random.Random(5)
    batches = [
        [(entry_id, rng.randbytes(rng.randrange(1, 3000))) for entry_id in range(first, first + 7)]
        for first in range(0, 70, 7)
    ]
    stored: dict[str, list[tuple[int, int, bytes]]] = {}
    counted: dict[str, dict[int, int | None]] = {}  # each log's record count, as tallied
    for way in ("one_by_one", "batched"):
        disk = OsDisk()
        logger = EntryLogger(
            disk, str(tmp_path / way), max_log_size=16 << 10, write_buffer_size=4 << 10
        )
        await logger.open()
        stored[way] = []
        for batch in batches:
            if way == "batched":
                locations = logger.append_many(9, batch)
            else:
                locations = [logger.append(9, entry_id, body) for entry_id, body in batch]
            stored[way] += [(loc, e, b) for loc, (e, b) in zip(locations, batch, strict=True)]
        await logger.sync()
        logs = sorted({unpack_location(loc)[0] for loc, _, _ in stored[way]})
        counted[way] = {log: await logger.known_record_count(log) for log in logs}
        try:
            for location, entry_id, body in stored[way]:
                assert await logger.read(location, 9, entry_id) == body
        finally:
            await logger.close()
            await disk.close()
    assert stored["batched"] == stored["one_by_one"]
    # Compaction divides each log's live records by its count: a batch that rolls counts each
    # record in the log that holds it.
    held = Counter(unpack_location(loc)[0] for loc, _, _ in stored["batched"])
    assert counted["batched"] == counted["one_by_one"] == dict(held)
    assert len({unpack_location(loc)[0] for loc, _, _ in stored["batched"]}) > 5  # it rolled
    for name in os.listdir(tmp_path / "one_by_one"):
        one = (tmp_path / "one_by_one" / name).read_bytes()
        assert (tmp_path / "batched" / name).read_bytes() == one
