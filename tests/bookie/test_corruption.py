"""Damaged files after a crash: detected by checksums and refused or repaired, never served."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from aiobk.bookie import Bookie, BookieConfig, IndexCorruptError, JournalCorruptError
from aiobk.bookie.entrylog.format import RECORD_HEAD, unpack_location
from aiobk.bookie.index.rocks import FAMILIES
from aiobk.metadata import free_port
from aiobk.protocol import (
    HEADER_SIZE,
    AddBatchRequest,
    AddBatchResponse,
    ReadFlag,
    ReadRequest,
    StatusCode,
    pack_bodies,
    parse_entry,
    unpack_statuses,
)
from tests.bookie.helpers import DIGEST, KEY, add, body, read


async def _filled(tmp_path: Path, connect, entries: int = 6, clean: bool = True) -> BookieConfig:
    config = BookieConfig(data_dir=str(tmp_path / "data"), port=free_port())  # same identity
    bookie = Bookie(config)
    await bookie.start()
    conn = await connect(bookie)
    for entry in range(entries):
        assert (await add(conn, 1, entry, b"entry-%d" % entry)).status is StatusCode.EOK
    conn.close()
    if clean:
        await bookie.stop()
    else:
        await bookie.crash()
    return config


async def test_flipped_byte_in_entry_log_is_eio_not_data(tmp_path: Path, connect) -> None:
    config = await _filled(tmp_path, connect)
    bookie = Bookie(config)
    await bookie.start()
    log_id, offset = unpack_location(bookie.storage.ledgers[1].location(3))
    await bookie.stop()
    path = tmp_path / "data" / "ledgers" / "entries" / f"{log_id:08x}.log"
    data = bytearray(path.read_bytes())
    data[offset + RECORD_HEAD.size + HEADER_SIZE + 4 + 2] ^= 0x20  # a payload byte of entry 3
    path.write_bytes(bytes(data))

    bookie = Bookie(config)
    await bookie.start()
    try:
        conn = await connect(bookie)
        assert (await read(conn, 1, 3)).status is StatusCode.EIO
        good = await read(conn, 1, 2)
        assert DIGEST.verify(parse_entry(good.body), 1, 2) == b"entry-2"
        assert bookie.stats.corrupt_reads == 1
    finally:
        await bookie.stop()


async def test_damaged_index_refuses_to_boot(tmp_path: Path, connect) -> None:
    config = await _filled(tmp_path, connect)
    (manifest,) = (tmp_path / "data" / "ledgers" / "index.db").glob("MANIFEST-*")
    data = bytearray(manifest.read_bytes())
    data[20] ^= 0xFF
    manifest.write_bytes(bytes(data))
    with pytest.raises(IndexCorruptError, match="index database"):
        await Bookie(config).start()


def _damage_record_tables(tmp_path: Path) -> None:
    """Flip a byte in the first data block (ledger 1's keys) of every table of the index's
    family for ledger records and entry locations (bookie.index.rocks.FAMILIES)."""
    index = tmp_path / "data" / "ledgers" / "index.db"
    options = Options(raw_mode=True)
    plain = Rdict(str(index), options, column_families=dict.fromkeys(FAMILIES.values(), options))
    tables = [f["name"].lstrip("/") for f in plain.live_files() if f["start_key"][:1] == b"E"]
    plain.close()
    del plain
    assert tables
    for name in tables:
        data = bytearray((index / name).read_bytes())
        data[10] ^= 0xFF
        (index / name).write_bytes(bytes(data))


async def test_a_damaged_index_block_answers_eio_not_a_guess(tmp_path: Path, connect) -> None:
    """RocksDB checks a block's checksum when it reads it: a request whose lookup meets the
    damage is answered EIO, never from a guess, and counted."""
    config = await _filled(tmp_path, connect, entries=600)
    _damage_record_tables(tmp_path)
    bookie = Bookie(config)
    await bookie.start()
    try:
        conn = await connect(bookie)
        request = ReadRequest(conn.next_txn_id(), 1, 3, ReadFlag.NONE, b"", -1, 0)
        assert (await conn.send(request, 10)).status is StatusCode.EIO
        assert bookie.stats.corrupt_reads >= 1
    finally:
        await bookie.stop()


async def test_torn_journal_tail_after_crash_boots_with_every_ack(tmp_path: Path, connect) -> None:
    config = await _filled(tmp_path, connect, clean=False)
    (journal,) = (tmp_path / "data" / "journal").glob("*.txn")
    with journal.open("ab") as handle:
        handle.write(b"\xb0\x0c\x01\x00\x01\x00\x00" + b"\x07" * 30)
    bookie = Bookie(config)
    await bookie.start()
    try:
        conn = await connect(bookie)
        for entry in range(6):
            response = await read(conn, 1, entry)
            assert DIGEST.verify(parse_entry(response.body), 1, entry) == b"entry-%d" % entry
    finally:
        await bookie.stop()


async def test_damaged_journal_middle_refuses_and_cli_says_why(tmp_path: Path, connect) -> None:
    config = await _filled(tmp_path, connect, entries=20, clean=False)
    (journal,) = (tmp_path / "data" / "journal").glob("*.txn")
    data = bytearray(journal.read_bytes())
    used = len(data.rstrip(b"\0"))  # the file is zero-filled ahead of its records
    data[used // 2] ^= 0xFF  # inside the records, with good ones after it
    journal.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError):
        await Bookie(config).start()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiobk.bookie",
            "start",
            "--port",
            str(config.port),
            "--data-dir",
            config.data_dir,
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    last = result.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("python -m aiobk.bookie: error: refusing to start, data is damaged")


async def test_a_batch_meeting_a_damaged_index_block_answers_each_entry_eio(
    tmp_path: Path, connect
) -> None:
    """An ADD_BATCH whose entries' lookups meet the damage: each entry EIO, in one answer."""
    config = await _filled(tmp_path, connect, entries=600)
    _damage_record_tables(tmp_path)
    bookie = Bookie(config)
    await bookie.start()
    try:
        conn = await connect(bookie)
        bodies = pack_bodies([body(1, entry, b"more") for entry in (3, 600, 601)])
        request = AddBatchRequest(conn.next_txn_id(), 1, master_key=KEY, bodies=bodies)
        answer = await conn.send(request, 10)
        assert isinstance(answer, AddBatchResponse), answer
        assert answer.status is StatusCode.EOK
        assert unpack_statuses(answer.statuses, 3) == [StatusCode.EIO] * 3
        assert bookie.stats.corrupt_reads >= 3
    finally:
        await bookie.stop()
