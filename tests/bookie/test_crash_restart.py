"""kill -9 a bookie process in the middle of pipelined adds: nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aiobk.client import BookieConnection, BookKeeper
from aiobk.client.errors import BKError
from aiobk.protocol import LAC_ENTRY_ID, ForceRequest, ReadFlag, Response, StatusCode, parse_entry
from tests.bookie.helpers import DIGEST, KEY, add, add_request, read
from tests.support.names import unique_name
from tests.support.procs import BookieProcess

ENTRIES = 10_000
FAST_CHECKPOINTS = """
flush_interval = 0.05
journal_max_file_size = 262144
entry_log_max_size = 1048576
entry_log_write_buffer = 65536
"""


def _payload(entry: int) -> bytes:
    return (b"%08d" % entry) * 16


@pytest.mark.timeout(240)
@pytest.mark.parametrize("checkpoints", ["journal-only", "fast-checkpoints"])
async def test_sigkill_during_pipelined_adds_loses_nothing_acknowledged(
    tmp_path: Path, checkpoints: str
) -> None:
    args: list[str] = []
    if checkpoints == "fast-checkpoints":
        config = tmp_path / "bookie.toml"
        config.write_text(f'data_dir = "{tmp_path / "data"}"\n{FAST_CHECKPOINTS}')
        args = ["--config", str(config)]
    proc = BookieProcess(tmp_path / "data", None, *args)
    await proc.start()
    try:
        conn = await BookieConnection.open(*proc.address)
        acked: list[int] = []
        window = asyncio.Semaphore(512)  # pipelined: up to 512 adds in flight

        def on_done(entry: int, future: asyncio.Future[Response]) -> None:
            window.release()
            if not future.exception() and future.result().status is StatusCode.EOK:
                acked.append(entry)

        futures = []
        for entry in range(ENTRIES):
            await window.acquire()
            if len(acked) >= ENTRIES // 3 and proc.process and proc.process.poll() is None:
                proc.kill()
            request = add_request(conn, 1, entry, _payload(entry), lac=entry - 1)
            future = conn.send(request, 60)
            future.add_done_callback(lambda f, e=entry: on_done(e, f))
            futures.append(future)
        results = await asyncio.gather(*futures, return_exceptions=True)
        lost = [r for r in results if isinstance(r, BKError)]
        assert lost, "the kill should have cut some adds off"
        assert ENTRIES // 3 <= len(acked) < ENTRIES
        conn.close()

        await proc.start()
        conn = await BookieConnection.open(*proc.address)
        for entry in sorted(acked):
            response = await read(conn, 1, entry)
            assert response.status is StatusCode.EOK, (entry, response.status)
            assert DIGEST.verify(parse_entry(response.body), 1, entry) == _payload(entry)
        # The ledger carries on after the restart. The next entry may be held already (sent,
        # journaled, its answer cut off by the kill): the writer sends the same entry again,
        # and a bookie never takes other bytes for an entry it holds.
        next_entry = max(acked) + 1
        again = await add(conn, 1, next_entry, _payload(next_entry), lac=next_entry - 1)
        assert again.status is StatusCode.EOK
        conn.close()
        assert proc.terminate() == 0
        journals = sorted(p.name for p in (tmp_path / "data" / "journal").iterdir())
        assert (tmp_path / "data" / "ledgers" / "index.db" / "CURRENT").exists()
        if checkpoints == "fast-checkpoints":
            # Journal files rolled over and checkpoints released the early ones.
            assert "0000000000000000.txn" not in journals, journals
    finally:
        proc.stop()


@pytest.mark.timeout(120)
async def test_fence_survives_sigkill_and_clean_restart(tmp_path: Path) -> None:
    proc = BookieProcess(tmp_path / "data")
    await proc.start()
    try:
        conn = await BookieConnection.open(*proc.address)
        assert (await add(conn, 3, 0, b"zero")).status is StatusCode.EOK
        fenced = await read(conn, 3, LAC_ENTRY_ID, flags=ReadFlag.FENCE, key=KEY)
        assert fenced.status is StatusCode.EOK
        conn.close()
        proc.kill()

        await proc.start()
        conn = await BookieConnection.open(*proc.address)
        assert (await add(conn, 3, 1, b"stale writer")).status is StatusCode.EFENCED
        assert (await add(conn, 3, 1, b"recovery", recovery=True)).status is StatusCode.EOK
        conn.close()
        assert proc.terminate() == 0  # clean stop: checkpoint, then restart from it

        await proc.start()
        conn = await BookieConnection.open(*proc.address)
        assert (await add(conn, 3, 2, b"stale writer")).status is StatusCode.EFENCED
        assert (await read(conn, 3, 1)).status is StatusCode.EOK
        conn.close()
    finally:
        proc.stop()


@pytest.mark.timeout(120)
async def test_sigkill_of_a_journal_less_bookie_loses_what_was_not_flushed(
    tmp_path: Path, etcd_server
) -> None:
    """BP-46's premise, on a real process: without the journal an add is answered from ledger
    storage's memory, so SIGKILL before the next flush really loses it (boot-time fencing and
    limbo, tested in test_bp46, are what make that safe); FORCE makes what came before it
    survive."""
    config = tmp_path / "bookie.toml"
    config.write_text("flush_interval = 3600\nboot_repair = false\n")  # no flush on its own
    uri = etcd_server.uri(unique_name("journal-less-kill"))
    args = ("--no-journal-write-data", "--metadata", uri, "--config", str(config))
    proc = BookieProcess(tmp_path / "data", None, *args)
    await proc.start()
    try:
        # A ledger the metadata has, with the key the adds carry: a bookie with a store creates
        # no ledger it cannot find there.
        async with BookKeeper(uri) as bk:
            ledger = (await bk.create_ledger(1, 1, 1, password=b"secret")).ledger_id
        conn = await BookieConnection.open(*proc.address)
        for entry in range(50):
            assert (await add(conn, ledger, entry, _payload(entry))).status is StatusCode.EOK
        forced = await conn.send(ForceRequest(conn.next_txn_id(), ledger, KEY), 10)
        assert forced.status is StatusCode.EOK
        for entry in range(50, 100):
            assert (await add(conn, ledger, entry, _payload(entry))).status is StatusCode.EOK
        conn.close()
        proc.kill()

        await proc.start()
        conn = await BookieConnection.open(*proc.address)
        for entry in range(50):
            response = await read(conn, ledger, entry)
            assert response.status is StatusCode.EOK, (entry, response.status)
            assert DIGEST.verify(parse_entry(response.body), ledger, entry) == _payload(entry)
        lost = [
            e for e in range(50, 100) if (await read(conn, ledger, e)).status is not StatusCode.EOK
        ]
        assert lost == list(range(50, 100)), "acknowledged but never flushed: gone with the process"
        conn.close()
    finally:
        proc.stop()
