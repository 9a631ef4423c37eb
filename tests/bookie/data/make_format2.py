"""Writes ``format2-bookie.tar.gz``: a bookie data directory in the index format of aiobk before
the on-disk index (index segments, format 2), for the upgrade test (tests/bookie/test_upgrade.py).

Run it with the code of that time, e.g. from a worktree of commit f83c980::

    git worktree add /tmp/f83c980 f83c980
    cd /tmp/f83c980 && PYTHONPATH=. python /path/to/tests/bookie/data/make_format2.py OUT_DIR

The same scenario, run with the code of commit 1f1bebe (a RocksDB index with every key in its
default column family, before the index gave each key prefix a family of its own) and an
archive name as the second argument, wrote ``rocks-one-family-bookie.tar.gz``.

What the directory holds (``expected.json`` beside it says it exactly): ledgers 1..40 with 1-3
entries, ledger 41 with 1,000 (a dense page), ledger 42 with entries 0 and 90,000 (a sparse far
page), ledger 43 fenced, ledger 44 with an explicit LAC, ledger 45 dropped by garbage collection;
a clean stop's checkpoint (segments), then entries 1..3 of ledger 46 and entry 3 of ledger 1 after
it, and a crash: those are in the journal only.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tarfile
from pathlib import Path

from aiobk.bookie import Bookie, BookieConfig
from aiobk.client import BookieConnection
from aiobk.metadata import free_port
from aiobk.protocol import ReadFlag, ReadRequest, StatusCode, WriteLacRequest
from tests.bookie.helpers import KEY, add


async def main(out: Path, archive: str = "format2-bookie.tar.gz") -> None:
    data = out / "data"
    config = BookieConfig(
        data_dir=str(data), port=free_port(), disk_reserved_space=0, journal_alignment=0
    )
    bookie = Bookie(config)
    await bookie.start()
    conn = await BookieConnection.open(bookie.address.host, bookie.address.port)
    entries: dict[int, list[int]] = {}

    async def put(ledger: int, entry: int) -> None:
        response = await add(conn, ledger, entry, b"L%d-E%d" % (ledger, entry), lac=entry - 1)
        assert response.status is StatusCode.EOK, response
        entries.setdefault(ledger, []).append(entry)

    for ledger in range(1, 41):
        for entry in range(1 + ledger % 3):
            await put(ledger, entry)
    for entry in range(1000):
        await put(41, entry)
    await put(42, 0)
    await put(42, 90_000)
    await put(43, 0)
    fence = ReadRequest(conn.next_txn_id(), 43, 0, ReadFlag.FENCE, KEY, -1, 0)
    assert (await conn.send(fence, 10)).status is StatusCode.EOK
    await put(44, 0)
    lac = WriteLacRequest(conn.next_txn_id(), 44, KEY, 7)
    assert (await conn.send(lac, 10)).status is StatusCode.EOK
    await put(45, 0)
    await bookie.checkpoint()
    assert bookie.storage.delete_ledger(45)  # what a GC pass does
    entries.pop(45)
    await bookie.stop()  # a clean stop: the last checkpoint's segments

    bookie = Bookie(config)
    await bookie.start()
    conn = await BookieConnection.open(bookie.address.host, bookie.address.port)
    for entry in range(3):
        await put(46, entry)
    await put(1, 3)
    conn.close()
    await bookie.crash()  # these four are in the journal only

    expected = {
        "entries": {str(k): v for k, v in sorted(entries.items())},
        "fenced": [43],
        "lac": {"44": 7},
        "deleted": [45],
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    with tarfile.open(out / archive, "w:gz") as tar:
        tar.add(data, arcname="data")
        tar.add(out / "expected.json", arcname="expected.json")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), *sys.argv[2:3]))
