"""The owner of per-ledger state (``bookie.ledgers``) on real files: every transition is
journaled as it happens, replay (``apply``) brings a fresh boot to the same state, and what a
transition changes reaches the index at the next checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiobk.bookie.checkpoints import Checkpoints
from aiobk.bookie.journal.format import FILE_HEADER
from aiobk.bookie.ledger_state import LedgerState
from aiobk.bookie.ledgers import Ledgers
from aiobk.protocol import DigestType, StatusCode, pack_entry, pack_header
from tests.bookie.helpers import booted_ledgers

KEY = b"k" * 20


def _entry(ledger_id: int, entry_id: int, lac: int) -> bytes:
    payload = b"entry %d" % entry_id
    return pack_entry(
        pack_header(ledger_id, entry_id, lac, len(payload), DigestType.DUMMY), b"", payload
    )


def _booted(tmp_path: Path, replay: bool = True, **settings: Any) -> Any:
    return booted_ledgers(str(tmp_path), replay=replay, **settings)


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
    a fence of a ledger boot already fenced dirties nothing else (found in a review)."""
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


async def _checkpoint(ledgers: Ledgers) -> None:
    await ledgers.durable()
    await ledgers.storage.checkpoint(ledgers.journal.last_lsn)


async def test_idle_states_are_dropped_and_load_back_as_they_were(tmp_path: Path) -> None:
    """After a checkpoint, idle ledger states beyond ``ledger_state_cache_size`` are
    dropped; loading one back from the index gives the same state, its BP-14 sync cursor
    included (everything the index names is synced)."""
    async with _booted(tmp_path, ledger_state_cache_size=2) as ledgers:
        done: list[BaseException | None] = []
        for ledger_id in range(1, 11):
            state, _ = ledgers.ensure(ledger_id, KEY)
            assert state is not None
            for entry_id in range(ledger_id % 4 + 1):
                body = _entry(ledger_id, entry_id, entry_id - 2)
                ledgers.add(state, entry_id, body, entry_id - 2, done.append)
            if ledger_id % 3 == 0:
                assert await ledgers.fence(state) is None
            if ledger_id % 5 == 0:
                ledgers.set_limbo(state, True)
        await ledgers.durable()
        storage = ledgers.storage
        before = {i: (_view(s), s.last_add_synced) for i, s in storage.ledgers.items()}
        assert storage.states_in_use == 10
        await _checkpoint(ledgers)
        assert storage.states_in_use == 2
        assert ledgers.stats.ledger_states_dropped == 8
        after = {i: (_view(s), s.last_add_synced) for i, s in storage.ledgers.items()}
        assert after == before
        assert ledgers.stats.ledger_states_loaded == 8
        assert all(synced == max(entries) for (*_, entries), synced in after.values())


class _Poll:
    def __init__(self, previous_lac: int = -1) -> None:
        self.previous_lac = previous_lac
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1


async def test_a_state_in_use_is_never_dropped(tmp_path: Path) -> None:
    """A long poll waits on the state object itself, and a fence not yet durable is in it:
    neither may be dropped (a second object for the ledger would split them)."""
    async with _booted(tmp_path, ledger_state_cache_size=1) as ledgers:
        for ledger_id in (1, 2, 3):
            assert ledgers.ensure(ledger_id, KEY)[1] is StatusCode.EOK
        await _checkpoint(ledgers)
        polled = ledgers.get(1)
        assert polled is not None
        polled.add_waiter(_Poll())
        fencing = ledgers.get(2)
        assert fencing is not None
        # A fence journaled and not synced yet (or whose record failed): held until it is.
        fencing.fence_pending = asyncio.get_running_loop().create_future()
        await _checkpoint(ledgers)
        assert ledgers.get(1) is polled
        assert ledgers.get(2) is fencing
        assert ledgers.storage.states_in_use == 2  # ledger 3, idle, was dropped


async def test_a_full_write_cache_asks_for_a_checkpoint(tmp_path: Path) -> None:
    async with _booted(tmp_path, write_cache_max_size=800) as ledgers:  # ten locations
        asked: list[bool] = []
        ledgers.storage.on_cache_full = lambda: asked.append(True)
        state, _ = ledgers.ensure(1, KEY)
        assert state is not None
        for entry_id in range(9):
            ledgers.add(state, entry_id, _entry(1, entry_id, -1), -1, lambda error: None)
        assert not asked
        ledgers.add(state, 9, _entry(1, 9, -1), -1, lambda error: None)
        assert asked
        await _checkpoint(ledgers)
        assert ledgers.storage.write_cache_bytes == 0


async def test_a_second_read_of_an_entry_comes_from_the_read_cache(tmp_path: Path) -> None:
    async with _booted(tmp_path) as ledgers:
        state, _ = ledgers.ensure(1, KEY)
        assert state is not None
        ledgers.add(state, 0, _entry(1, 0, -1), -1, lambda error: None)
        await _checkpoint(ledgers)  # written out: reads go to the file
        storage = ledgers.storage
        first = await storage.read_entry(state, 0)
        assert await storage.read_entry(state, 0) == first
        assert ledgers.stats.read_cache_hits == 1


async def test_new_ledgers_piling_up_ask_for_a_checkpoint(tmp_path: Path) -> None:
    """A peer creating ledgers by the thousand (fencing unknown ids) holds a state each until
    the next checkpoint: twice ``ledger_state_cache_size`` of them start one early."""
    async with _booted(tmp_path, ledger_state_cache_size=2) as ledgers:
        asked: list[bool] = []
        ledgers.storage.on_cache_full = lambda: asked.append(True)
        for ledger_id in range(1, 4):
            assert ledgers.ensure(ledger_id, KEY)[1] is StatusCode.EOK
        assert not asked
        assert ledgers.ensure(4, KEY)[1] is StatusCode.EOK
        assert asked
        await _checkpoint(ledgers)
        assert ledgers.storage.states_in_use == 2


async def test_a_restart_reads_the_journal_from_the_checkpoint_on(tmp_path: Path) -> None:
    """Restart cost follows the journal since the last checkpoint, not the journal file (a
    restart after a million ledgers once parsed up to half a gigabyte of covered records, 11 s).
    The checkpoint keeps where the journal stood; replay starts there. Shown by damaging a
    record before that point, which a read from the file's start refuses."""
    done: list[BaseException | None] = []
    async with _booted(tmp_path) as ledgers:
        checkpoints = Checkpoints(ledgers.storage, ledgers.journal, ledgers.stats, lambda e: None)
        first, _ = ledgers.ensure(1, KEY)
        assert first is not None
        for entry_id in range(20):
            ledgers.add(
                first, entry_id, _entry(1, entry_id, entry_id - 1), entry_id - 1, done.append
            )
        await ledgers.durable()
        await checkpoints.checkpoint(release=False)
        second, _ = ledgers.ensure(2, KEY)
        assert second is not None
        for entry_id in range(3):
            ledgers.add(second, entry_id, _entry(2, entry_id, -1), -1, done.append)
        await ledgers.durable()
    assert done == [None] * 23
    (journal_file,) = (tmp_path / "journal").glob("*.txn")
    data = bytearray(journal_file.read_bytes())
    data[FILE_HEADER.size + 25] ^= 0xFF  # inside the first record: ledger 1's, checkpointed
    journal_file.write_bytes(bytes(data))
    async with _booted(tmp_path) as again:
        assert again.storage.journal_start is not None
        one, two = again.get(1), again.get(2)
        assert one is not None
        assert two is not None
        assert (one.max_entry, two.max_entry) == (19, 2)  # 1 from the index, 2 replayed
        assert [again.storage.ledgers[2].location(e) >= 0 for e in range(3)] == [True] * 3


async def test_a_lac_advance_answers_only_the_polls_it_passes(tmp_path: Path) -> None:
    """A poll waiting for the LAC to pass 10 is not answered when it moves to 6 (it was: every
    poll woke at every advance), and an advance costs only the polls it answers."""
    async with _booted(tmp_path) as ledgers:
        state, _status = ledgers.ensure(1, KEY)
        assert state is not None
        low, high, gone = _Poll(4), _Poll(10), _Poll(2)
        for poll in (low, high, gone):
            state.add_waiter(poll)
        state.remove_waiter(gone)  # timed out before the LAC moved
        state.advance_lac(6)
        assert (low.woken, high.woken, gone.woken) == (1, 0, 0)
        assert state.waiters == {high}
        state.advance_lac(10)
        assert high.woken == 0  # 10 does not pass 10
        state.advance_lac(11)
        assert high.woken == 1
        assert not state.waiters
        # Polls that leave before being answered do not pile up behind the waiting ones.
        keeper = _Poll(1_000_000)
        state.add_waiter(keeper)
        for _ in range(1000):
            passer = _Poll(1_000_000)
            state.add_waiter(passer)
            state.remove_waiter(passer)
        assert len(state._due or []) < 200
        assert state.waiters == {keeper}
