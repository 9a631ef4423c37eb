"""Entry reads from the entry logs on disk (bookie.entrylog): whatever a record's size and
wherever it starts in a page -- within the first read, just past it, spanning pages, or bigger
than a page -- it reads back whole and checked, cold or cached."""

from __future__ import annotations

import os
import random
from pathlib import Path

from aiobk.bookie import OsDisk
from aiobk.bookie.entrylog import PAGE, EntryLogger, unpack_location


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
