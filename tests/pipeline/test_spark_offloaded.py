"""A Spark batch read of a log whose ledgers are offloaded to an object store: the same rows as
before the offload, also with every bookie that held them stopped (real etcd, bookie processes
and a directory store; the session's Spark)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess, OffloadStoreSettings
from tests.support.procs import BookieProcess


async def _write_and_offload(uri: str, objects: Path, phase: str) -> None:
    async with await BookKeeper.connect(uri) as bk:
        if phase == "write":
            for ledger in range(3):
                async with await bk.open_log_writer("cold") as writer:
                    await asyncio.gather(
                        *(writer.append(b"%d:%d" % (ledger, i), key=b"k") for i in range(50))
                    )
            return
        await bk.store.set_offload_store(OffloadStoreSettings(f"file://{objects}", 0))
        report = await bk.offload_log("cold")
        assert [item.outcome for item in report.ledgers] == ["released"] * 3


@pytest.mark.timeout(300)
def test_a_spark_read_of_an_offloaded_log_needs_no_bookie(spark: Any, tmp_path: Path) -> None:
    etcd = EtcdProcess(data_dir=str(tmp_path / "etcd")).start()
    uri = etcd.uri("offloaded")
    bookies = [BookieProcess(tmp_path / f"bookie{i}", None, "--metadata", uri) for i in range(3)]
    (tmp_path / "objects").mkdir()
    try:
        asyncio.run(_start(bookies))
        asyncio.run(_write_and_offload(uri, tmp_path / "objects", "write"))

        def rows() -> list[tuple[Any, ...]]:
            read = spark.read.format("aiobk").option("metadata", uri).option("log", "cold")
            found = read.option("split", "40").load().collect()
            return sorted((r.ledger_id, r.entry_id, r.data, r.key, r.position) for r in found)

        before = rows()
        assert len(before) == 150
        asyncio.run(_write_and_offload(uri, tmp_path / "objects", "offload"))
        for bookie in bookies:
            bookie.stop()
        assert rows() == before
    finally:
        for bookie in bookies:
            if bookie.process is not None and bookie.process.poll() is None:
                bookie.stop()
        etcd.stop()


async def _start(bookies: list[BookieProcess]) -> None:
    await asyncio.gather(*(b.start() for b in bookies))
