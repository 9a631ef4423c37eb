"""The owner of per-ledger state (``bookie.ledger_state``) on real files: every transition is
journaled as it happens, replay (``apply``) brings a fresh boot to the same state, and what a
transition changes reaches the index at the next checkpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiobk.bookie import BookieConfig, OsDisk
from aiobk.bookie.journal import Journal
from aiobk.bookie.journal_policy import GroupCommitPolicy
from aiobk.bookie.ledger import LedgerState
from aiobk.bookie.ledger_state import Ledgers
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.protocol import DigestType, StatusCode, pack_entry, pack_header

KEY = b"k" * 20


def _entry(ledger_id: int, entry_id: int, lac: int) -> bytes:
    payload = b"entry %d" % entry_id
    return pack_entry(
        pack_header(ledger_id, entry_id, lac, len(payload), DigestType.DUMMY), b"", payload
    )


@asynccontextmanager
async def _booted(tmp_path: Path, replay: bool = True) -> AsyncIterator[Ledgers]:
    """Ledger storage and a journal over ``tmp_path``, booted as the bookie boots them (index,
    then the journal after its mark); stopped cleanly (no checkpoint) on exit."""
    config = BookieConfig(data_dir=str(tmp_path), disk_reserved_space=0)
    disk = OsDisk()
    stats = BookieStats()
    storage = LedgerStorage(disk, config, stats)
    journal = Journal(disk, config.journal_path, GroupCommitPolicy(), max_file_size=1 << 20)
    ledgers = Ledgers(storage, journal, stats)
    await disk.makedirs(config.ledgers_path)
    mark = await storage.open()
    await journal.replay(mark, ledgers.apply if replay else lambda record: None)
    await journal.start(mark + 1)
    try:
        yield ledgers
    finally:
        await journal.stop()
        await storage.close()
        await disk.close()


def _view(state: LedgerState) -> tuple[object, ...]:
    entries = tuple(entry for entry in range(state.max_entry + 1) if state.location(entry) >= 0)
    return (state.master_key, state.fenced, state.limbo, state.lac, state.max_entry, entries)


async def test_replay_brings_back_what_each_transition_did(tmp_path: Path) -> None:
    async with _booted(tmp_path) as ledgers:
        added, status = ledgers.ensure(1, KEY)
        assert added is not None
        assert status is StatusCode.EOK
        done: list[BaseException | None] = []
        for entry_id in range(3):
            ledgers.add(
                added, entry_id, _entry(1, entry_id, entry_id - 1), entry_id - 1, done.append
            )
        ledgers.write_lac(added, 2, done.append)
        fenced = ledgers.create_keyless(2)
        assert await ledgers.fence(fenced) is None
        ledgers.set_limbo(fenced, True)
        copied, _ = ledgers.ensure(3, KEY)
        assert copied is not None
        ledgers.copy(copied, 7, _entry(3, 7, 6))
        await ledgers.durable()
        assert done == [None] * 4
        before = {i: _view(s) for i, s in ledgers.storage.ledgers.items()}
    assert before[1] == (KEY, False, False, 2, 2, (0, 1, 2))
    assert before[2] == (b"", True, True, -1, -1, ())
    async with _booted(tmp_path) as again:  # nothing checkpointed: all from the journal
        assert {i: _view(s) for i, s in again.storage.ledgers.items()} == before


async def test_a_keyless_ledger_keeps_the_key_it_learns_past_a_checkpoint(tmp_path: Path) -> None:
    """BP-46: a ledger created at boot with its key unknown learns the key from the first fence
    or add that brings it. That must reach the index: a checkpoint trims the journal record, and
    a fence of a ledger boot already fenced dirties nothing else (found in issue 14's review)."""
    async with _booted(tmp_path) as ledgers:
        state = ledgers.create_keyless(5)
        ledgers.start_fence(state)
        await ledgers.durable()
        await ledgers.storage.checkpoint(ledgers.journal.last_lsn)  # key unknown, fenced
        await ledgers.journal.release(ledgers.journal.last_lsn)
        learned, status = ledgers.ensure(5, KEY)  # the recovery's fencing read brings it
        assert learned is state
        assert status is StatusCode.EOK
        assert await ledgers.fence(state) is None
        await ledgers.storage.checkpoint(ledgers.journal.last_lsn)
        await ledgers.journal.release(ledgers.journal.last_lsn)
    async with _booted(tmp_path, replay=False) as again:  # the index alone
        reloaded = again.get(5)
        assert reloaded is not None
        assert (reloaded.master_key, reloaded.fenced) == (KEY, True)


async def test_a_replayed_key_of_a_keyless_ledger_reaches_the_index(tmp_path: Path) -> None:
    """The same through replay: the checkpoint after boot trims the journal, so the key that
    replay taught must go into the index."""
    async with _booted(tmp_path) as ledgers:
        ledgers.start_fence(ledgers.create_keyless(6))
        await ledgers.durable()
        await ledgers.storage.checkpoint(ledgers.journal.last_lsn)
        ledgers.ensure(6, KEY)
        await ledgers.durable()
    async with _booted(tmp_path) as booted:  # replays the key, then checkpoints as boot does
        await booted.storage.checkpoint(booted.journal.last_lsn)
        await booted.journal.release(booted.journal.last_lsn)
    async with _booted(tmp_path, replay=False) as again:
        reloaded = again.get(6)
        assert reloaded is not None
        assert reloaded.master_key == KEY


async def test_a_durable_fence_is_not_journaled_twice(tmp_path: Path) -> None:
    """Boot phase one fences through the same guard as fencing reads: no second record."""
    async with _booted(tmp_path) as ledgers:
        state, _ = ledgers.ensure(7, KEY)
        assert state is not None
        assert await ledgers.fence(state) is None
        lsn = ledgers.journal.last_lsn
        assert ledgers.start_fence(state) is None
        assert await ledgers.fence(state) is None
        assert ledgers.journal.last_lsn == lsn
        assert ledgers.stats.fences == 1


async def test_keys_are_checked_and_deleted_ledgers_stay_deleted(tmp_path: Path) -> None:
    async with _booted(tmp_path) as ledgers:
        assert ledgers.ensure(8, b"") == (None, StatusCode.EBADREQ)  # a new ledger needs a key
        ledgers.ensure(8, KEY)
        assert ledgers.ensure(8, b"other") == (None, StatusCode.EUA)
        assert ledgers.stats.auth_failures == 1
        assert ledgers.storage.delete_ledger(8)
        assert ledgers.ensure(8, KEY) == (None, StatusCode.ENOLEDGER)
