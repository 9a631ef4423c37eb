"""The upgrade path: a data directory written by aiobk before the on-disk index --
index segments in format 2, made by ``data/make_format2.py`` with that code (commit f83c980) --
is converted on start, serves everything it held, and keeps it across restarts; a conversion
cut off part-way is done again from the start, and the old segments go only once the new index
holds everything."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from aiobk.bookie import Bookie, BookieConfig, OsDisk
from aiobk.bookie.index.engine import IndexBatch, IndexDb
from aiobk.bookie.index.rocks import FAMILIES, RocksIndexDb
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.metadata import free_port
from aiobk.protocol import LAC_ENTRY_ID, StatusCode, parse_entry
from tests.bookie.helpers import DIGEST, add, read

ARCHIVE = Path(__file__).parent / "data" / "format2-bookie.tar.gz"


ONE_FAMILY = Path(__file__).parent / "data" / "rocks-one-family-bookie.tar.gz"


def _unpack(tmp_path: Path, archive: Path = ARCHIVE) -> tuple[BookieConfig, dict[str, Any]]:
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    expected = json.loads((tmp_path / "expected.json").read_text())
    for cookie in (tmp_path / "data").rglob("COOKIE"):
        cookie.unlink()  # they name the paths and port the archive was made at
    config = BookieConfig(data_dir=str(tmp_path / "data"), port=free_port(), disk_reserved_space=0)
    return config, expected


async def _check_everything(bookie: Bookie, connect, expected: dict[str, Any]) -> None:
    conn = await connect(bookie)
    for ledger, entries in expected["entries"].items():
        for entry in entries:
            response = await read(conn, int(ledger), entry)
            assert response.status is StatusCode.EOK, (ledger, entry, response.status)
            payload = DIGEST.verify(parse_entry(response.body), int(ledger), entry)
            assert payload == b"L%s-E%d" % (ledger.encode(), entry)
        last = max(entries)
        assert (await read(conn, int(ledger), last + 1)).status is StatusCode.ENOENTRY
    for ledger in expected["fenced"]:
        assert (await add(conn, ledger, 99, b"late")).status is StatusCode.EFENCED
    for ledger, lac in expected["lac"].items():
        assert (await read(conn, int(ledger), LAC_ENTRY_ID)).lac >= lac
    for ledger in expected["deleted"]:
        assert (await add(conn, ledger, 1, b"back?")).status is StatusCode.ENOLEDGER
        assert (await read(conn, ledger, 0)).status is StatusCode.ENOLEDGER


@pytest.mark.timeout(60)
async def test_a_format_2_directory_is_converted_and_serves_all_it_held(
    tmp_path: Path, connect
) -> None:
    config, expected = _unpack(tmp_path)
    assert list((tmp_path / "data" / "ledgers" / "index").glob("*.idx"))
    bookie = Bookie(config)
    await bookie.start()
    try:
        assert bookie.booted.replayed > 0  # the four adds after its last checkpoint
        assert not list((tmp_path / "data" / "ledgers" / "index").glob("*.idx"))
        assert len(bookie.storage.ledgers) == len(expected["entries"])
        await _check_everything(bookie, connect, expected)
        conn = await connect(bookie)
        assert (await add(conn, 1, 4, b"L1-E4")).status is StatusCode.EOK  # carries on
    finally:
        await bookie.stop()
    expected["entries"]["1"].append(4)
    again = Bookie(config)
    await again.start()  # from the new index alone
    try:
        assert again.stats.ledger_states_loaded == 0  # nothing loaded until asked for
        await _check_everything(again, connect, expected)
    finally:
        await again.stop()


@pytest.mark.timeout(60)
async def test_an_index_of_one_column_family_is_moved_into_families_and_serves_all_it_held(
    tmp_path: Path, connect
) -> None:
    """A data directory whose RocksDB index holds every key in its default family (the same
    scenario as the format 2 archive, written by commit 1f1bebe: ``data/make_format2.py``)
    starts, its index moved into the families (bookie.index.rocks), and serves everything."""
    config, expected = _unpack(tmp_path, ONE_FAMILY)
    index = str(tmp_path / "data" / "ledgers" / "index.db")
    options = Options(raw_mode=True)
    assert Rdict.list_cf(index, options) == ["default"]
    bookie = Bookie(config)
    await bookie.start()
    try:
        assert bookie.booted.replayed > 0  # the four adds after its last checkpoint
        await _check_everything(bookie, connect, expected)
    finally:
        await bookie.stop()
    assert set(Rdict.list_cf(index, options)) == {"default", *FAMILIES.values()}
    again = Bookie(config)
    await again.start()
    try:
        await _check_everything(again, connect, expected)
    finally:
        await again.stop()


class _CutOff(IndexDb):
    """An index engine that dies after ``writes`` batches (a crash mid-conversion)."""

    def __init__(self, db: IndexDb, writes: int) -> None:
        self.db, self.left = db, writes

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def scan(self, start: bytes, end: bytes) -> Any:
        return self.db.scan(start, end)

    async def write(self, batch: IndexBatch) -> None:
        if self.left == 0:
            raise OSError("killed mid-conversion")
        self.left -= 1
        await self.db.write(batch)

    async def close(self) -> None:
        await self.db.close()


@pytest.mark.timeout(60)
async def test_a_conversion_cut_off_part_way_is_done_again(
    tmp_path: Path, connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, expected = _unpack(tmp_path)
    monkeypatch.setattr("aiobk.bookie.upgrade.convert.BATCH_KEYS", 20)  # several batches

    async def cut_off(path: str) -> IndexDb:
        return _CutOff(await RocksIndexDb.open(path), writes=2)

    storage = LedgerStorage(OsDisk(), config, BookieStats(), open_index=cut_off)
    with pytest.raises(OSError, match="mid-conversion"):
        await storage.open()
    assert list((tmp_path / "data" / "ledgers" / "index").glob("*.idx"))  # still there
    bookie = Bookie(config)
    await bookie.start()
    try:
        assert not list((tmp_path / "data" / "ledgers" / "index").glob("*.idx"))
        await _check_everything(bookie, connect, expected)
    finally:
        await bookie.stop()
