"""A crash between any two steps of a checkpoint loses nothing acknowledged, with the
production index engine and with the simulator's twin.

A checkpoint is: seal the write cache at the journal mark, sync the entry logs, commit the
sealed batch, release the journal behind the mark (``bookie.storage``). A child process adds
entries (all journal-synced, so acknowledged), runs one whole checkpoint, adds more, then runs
the next checkpoint only up to a step and kills itself with SIGKILL. The parent opens what is
left as a bookie boots it -- index, then the journal after the index's mark -- and every entry
must be there, with each ledger's state. (Lost page-cache writes are the simulator's part: its
disks drop what was not synced.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from aiobk.bookie import OsDisk
from aiobk.bookie.index.engine import IndexDb
from aiobk.bookie.index.rocks import RocksIndexDb
from aiobk.bookie.index.twin import LogIndexDb
from aiobk.bookie.ledgers import Ledgers
from aiobk.protocol import DigestType, pack_entry, pack_header
from tests.bookie.helpers import booted_ledgers

KEY = b"k" * 20
LEDGERS = (1, 2, 3)
STEPS = ("nothing", "sealed", "entry logs synced", "committed", "journal released")


def _entry(ledger_id: int, entry_id: int) -> bytes:
    payload = b"L%d-E%d" % (ledger_id, entry_id) + b"." * 1000  # the journal rolls often
    return pack_entry(
        pack_header(ledger_id, entry_id, entry_id - 1, len(payload), DigestType.DUMMY), b"", payload
    )


def _booted(data: str, engine: str) -> Any:
    def index(disk: OsDisk) -> Callable[[str], Awaitable[IndexDb]]:
        async def opener(path: str) -> IndexDb:
            if engine == "rocks":
                return await RocksIndexDb.open(path)
            return await LogIndexDb.open(disk, path)

        return opener

    return booted_ledgers(data, journal_file_size=16 << 10, index=index)


async def _add(ledgers: Ledgers, first: int, last: int) -> None:
    for ledger_id in LEDGERS:
        state, _status = ledgers.ensure(ledger_id, KEY)
        assert state is not None
        for entry_id in range(first, last):
            ledgers.add(state, entry_id, _entry(ledger_id, entry_id), entry_id - 1, _ignore)
            if entry_id % 10 == 9:
                await ledgers.durable()  # one journal write each: the journal rolls over
    await ledgers.durable()


def _ignore(error: BaseException | None) -> None:
    assert error is None


async def child(data: str, engine: str, step: int) -> None:
    async with _booted(data, engine) as ledgers:
        storage, journal = ledgers.storage, ledgers.journal
        await _add(ledgers, 0, 40)
        fenced = ledgers.get(2)
        assert fenced is not None
        assert await ledgers.fence(fenced) is None
        await storage.checkpoint(journal.last_lsn)
        await journal.release(journal.last_lsn)
        await _add(ledgers, 40, 80)
        mark = journal.last_lsn
        index = storage.index
        if step >= 1:
            for state in storage.ledgers.values():
                index.cache.put_state(state.ledger_id, state.record())
            sealed = index.seal(mark)
        if step >= 2:
            await storage.entry_logger.sync()
        if step >= 3:
            await index.commit(sealed)
        if step >= 4:
            await journal.release(mark)
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("engine", ["rocks", "twin"])
@pytest.mark.parametrize("step", range(len(STEPS)), ids=STEPS)
async def test_a_crash_at_any_step_of_a_checkpoint_loses_nothing(
    tmp_path: Path, engine: str, step: int
) -> None:
    data = str(tmp_path / "data")
    code = (
        "import asyncio; from tests.bookie.test_checkpoint_crash import child; "
        f"asyncio.run(child({data!r}, {engine!r}, {step}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, timeout=50
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    async with _booted(data, engine) as ledgers:
        for ledger_id in LEDGERS:
            state = ledgers.get(ledger_id)
            assert state is not None
            assert state.master_key == KEY
            assert state.fenced is (ledger_id == 2)
            assert state.max_entry == 79
            assert state.lac >= 78
            for entry_id in range(80):
                body = await ledgers.storage.read_entry(state, entry_id)
                assert body == _entry(ledger_id, entry_id), (ledger_id, entry_id)
        await ledgers.storage.checkpoint(ledgers.journal.last_lsn)  # and it carries on
        await asyncio.sleep(0)
