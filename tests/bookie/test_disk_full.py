"""Full disks: the pure decision, the journal's recovery, and a bookie turning read-only and
writable again (a full disk once bricked a bookie). Faults come from ``FaultyDisk`` (real files
with ENOSPC, torn writes and failing syncs on demand); ``tests/hostile/test_disk_full.py`` runs
the same on a real small filesystem."""

from __future__ import annotations

import asyncio
import errno
import json
import struct
import sys
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

import pytest

from aiobk.bookie import Bookie, BookieConfig
from aiobk.bookie.disk_monitor import Usage, judge
from aiobk.bookie.journal.journal import Journal, JournalFailedError
from aiobk.bookie.journal.policy import GroupCommitPolicy
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.write_state import DISK, JOURNAL, OPERATOR, WriteState
from aiobk.client import BookieConnection, BookKeeper
from aiobk.metadata import READ_ONLY, WRITABLE, MemoryKV, open_store
from aiobk.protocol import (
    AddRequest,
    BookieStateRequest,
    BookieStateResponse,
    ReadFlag,
    StateChange,
    StatusCode,
)
from tests.bookie.helpers import KEY, add, add_request, append_records, read
from tests.support.faulty_disk import FaultyDisk
from tests.support.names import unique_name
from tests.support.wait import wait_until

GIB = 1 << 30

# ---------------------------------------------------------------------- the decision (pure)


def _config(**kw: Any) -> BookieConfig:
    return BookieConfig(data_dir="/d", **kw)


def _usage(used: float, total: int = 100 * GIB) -> Usage:
    return Usage("/d", int(total * (1 - used)), total)


def test_full_above_the_threshold_and_writable_again_only_under_the_low_water_mark() -> None:
    config = _config(disk_usage_threshold=0.95, disk_usage_lwm_threshold=0.85)
    assert not judge([_usage(0.94)], config, was_full=False).full
    verdict = judge([_usage(0.951)], config, was_full=False)
    assert verdict.full
    assert "95.1% used" in verdict.why
    # Hysteresis: between the marks a full bookie stays full, a writable one stays writable.
    assert judge([_usage(0.90)], config, was_full=True).full
    assert not judge([_usage(0.90)], config, was_full=False).full
    assert not judge([_usage(0.85)], config, was_full=True).full


def test_any_filesystem_over_decides_and_warn_forces_gc() -> None:
    config = _config(disk_usage_warn_threshold=0.8)
    verdict = judge([_usage(0.1), _usage(0.97)], config, was_full=False)
    assert verdict.full
    assert verdict.warn
    assert judge([_usage(0.81)], config, was_full=False).warn
    assert not judge([_usage(0.79)], config, was_full=False).warn


def test_high_priority_writes_need_the_minimum_free_on_every_filesystem() -> None:
    config = _config(min_usable_size_for_high_priority_writes=GIB)
    assert judge([_usage(0.5, 4 * GIB)], config, was_full=False).room_for_high_priority
    assert not judge([_usage(0.9, 4 * GIB)], config, was_full=False).room_for_high_priority


def test_write_state_keeps_every_reason_and_tells_each_change() -> None:
    state = WriteState()
    changes: list[bool] = []
    state.on_change(changes.append)
    state.set(DISK, "full")
    state.set(OPERATOR, "asked")
    assert not state.writable
    assert state.high_priority  # room, and the journal works
    state.set(JOURNAL, "failed")
    assert not state.high_priority
    state.clear(DISK)
    state.clear(JOURNAL)
    assert not state.writable  # the operator's reason still holds
    state.clear(OPERATOR)
    assert state.writable
    assert changes == [False, True]  # one notice per transition, not per reason


# ---------------------------------------------------------------------- the journal


def _journal(path: Path, disk: FaultyDisk, **kw: Any) -> Journal:
    return Journal(disk, str(path), GroupCommitPolicy(), max_file_size=1 << 20, **kw)


@pytest.mark.parametrize("fault", ["no space", "torn write", "failed fdatasync"])
async def test_a_journal_that_failed_recovers_with_dense_lsns(tmp_path: Path, fault: str) -> None:
    disk = FaultyDisk()
    failures: list[BaseException] = []
    journal = _journal(tmp_path, disk, stats=BookieStats())
    journal.on_failure = failures.append
    await journal.replay(-1, lambda r: None)
    await journal.start()
    assert await append_records(journal, [b"a%d" % i for i in range(10)]) == [None] * 10
    if fault == "failed fdatasync":
        disk.sync_error = errno.EIO
    else:
        disk.full, disk.partial = True, fault == "torn write"
    results = await append_records(journal, [b"b%d" % i for i in range(5)])
    assert all(isinstance(r, JournalFailedError) for r in results)
    assert len(failures) == 1  # the bookie hears of it once, and turns read-only
    assert journal.failed is not None
    lsn = journal.next_lsn
    refused = await append_records(journal, [b"refused"])
    assert isinstance(refused[0], JournalFailedError)
    assert journal.next_lsn == lsn  # a refused record takes no LSN: no gap on disk
    assert not await journal.recover()  # still failing
    disk.full, disk.sync_error = False, 0
    assert await journal.recover()
    assert journal.failed is None
    assert await append_records(journal, [b"c%d" % i for i in range(3)]) == [None] * 3
    await journal.stop()
    await disk.close()
    seen: list[bytes] = []
    lsns: list[int] = []
    replayer = _journal(tmp_path, FaultyDisk())

    def apply(record: Any) -> None:
        seen.append(record.payload)
        lsns.append(record.lsn)

    await replayer.replay(-1, apply)
    assert lsns == list(range(len(lsns)))  # dense: replay would refuse a gap
    # What failed was answered with an error and written again on recovery: it may be found,
    # as any add that reached a disk unacknowledged may. Everything acknowledged is there.
    assert seen == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(5)] + [
        b"c%d" % i for i in range(3)
    ]


# ---------------------------------------------------------------------- a bookie


async def _state(conn: BookieConnection, change: StateChange = StateChange.QUERY) -> Any:
    response = await conn.send(BookieStateRequest(conn.next_txn_id(), change), 10)
    assert isinstance(response, BookieStateResponse)
    return response


async def _registered_state(uri: str, bookie: Bookie) -> str:
    store = open_store(uri)
    infos: dict[str, str] = {}

    async def agrees() -> bool:
        infos.clear()
        infos.update({b.bookie_id: b.state for b in await store.list_bookies()})
        wanted = WRITABLE if bookie.write_state.writable else READ_ONLY
        return infos.get(bookie.bookie_id) == wanted

    try:
        await wait_until(agrees, every=0.02, timeout=10, what="the registry agrees")
        return infos[bookie.bookie_id]
    except AssertionError:
        raise AssertionError(
            f"registry says {infos}, bookie says {bookie.write_state.reasons}"
        ) from None
    finally:
        await store.close()


async def _ledger(uri: str) -> int:
    """A ledger the metadata knows, so that a forced garbage collection keeps it."""
    async with await BookKeeper.connect(uri) as bk:
        lh = await bk.create_ledger(
            ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"secret"
        )
        return lh.ledger_id


async def _start(tmp_path: Path, disk: FaultyDisk, **settings: Any) -> tuple[Bookie, str]:
    uri = f"memory://{unique_name('diskfull')}"
    config = BookieConfig(
        data_dir=str(tmp_path / "bookie"),
        port=0,
        metadata_uri=uri,
        gc_interval=0,
        **{"disk_check_interval": 0.05, **settings},
    )
    bookie = Bookie(config, disk=disk)
    await bookie.start()
    return bookie, uri


@pytest.mark.timeout(60)
async def test_usage_over_the_threshold_makes_the_bookie_read_only_then_writable(
    tmp_path: Path,
) -> None:
    disk = FaultyDisk()
    bookie, uri = await _start(
        tmp_path, disk, disk_reserved_space=0, min_usable_size_for_high_priority_writes=1 << 20
    )
    conn = await BookieConnection.open(*bookie.address)
    try:
        ledger, later = await _ledger(uri), await _ledger(uri)
        assert (await add(conn, ledger, 0, b"before")).status is StatusCode.EOK
        disk.free = int(0.04 * (1 << 40))  # 96% used
        await wait_until(
            lambda: not bookie.write_state.writable, every=0.02, timeout=10, what="read-only"
        )
        assert await _registered_state(uri, bookie) == READ_ONLY
        assert (await add(conn, ledger, 1, b"refused")).status is StatusCode.EREADONLY
        # Reads, fencing and recovery adds are still served.
        assert (await read(conn, ledger, 0)).body is not None
        fenced = await read(conn, ledger, -1, flags=ReadFlag.FENCE, key=KEY)
        assert fenced.status is StatusCode.EOK
        recovery = await add(conn, ledger, 1, b"recovered", recovery=True)
        assert recovery.status is StatusCode.EOK
        state = await _state(conn)
        assert (state.writable, state.high_priority) == (0, 1)
        assert "disk:" in state.reasons
        assert bookie.stats.gc_forced >= 1  # over the warning threshold: GC was forced
        # No room left even for recovery: its adds are refused too.
        disk.free = 1 << 19
        await bookie.disk_monitor.check()
        assert (await _state(conn)).high_priority == 0
        refused = await add(conn, ledger, 2, b"no room", recovery=True)
        assert refused.status is StatusCode.EREADONLY
        disk.free = int(0.5 * (1 << 40))
        await wait_until(
            lambda: bookie.write_state.writable, every=0.02, timeout=10, what="writable again"
        )
        assert await _registered_state(uri, bookie) == WRITABLE
        assert (await add(conn, later, 0, b"after")).status is StatusCode.EOK
    finally:
        conn.close()
        await bookie.stop()
        MemoryKV.forget(uri[len("memory://") :])


@pytest.mark.timeout(60)
async def test_enospc_in_the_journal_turns_read_only_at_once_and_heals(tmp_path: Path) -> None:
    """Before: every add got EIO while the bookie stayed registered writable."""
    disk = FaultyDisk()
    bookie, uri = await _start(tmp_path, disk, disk_check_interval=3600.0)
    conn = await BookieConnection.open(*bookie.address)
    try:
        ledger = await _ledger(uri)
        assert (await add(conn, ledger, 0, b"kept")).status is StatusCode.EOK
        disk.full = True
        assert (await add(conn, ledger, 1, b"lost")).status is StatusCode.EIO
        assert not bookie.write_state.writable  # no wait for the next check
        assert await _registered_state(uri, bookie) == READ_ONLY
        assert (await add(conn, ledger, 2, b"refused")).status is StatusCode.EREADONLY
        assert bookie.stats.disk_full_errors >= 1
        disk.full = False
        await bookie.disk_monitor.check()
        assert bookie.write_state.writable, bookie.write_state.reasons
        assert await _registered_state(uri, bookie) == WRITABLE
        assert (await add(conn, ledger, 2, b"after")).status is StatusCode.EOK
    finally:
        conn.close()
        await bookie.stop()
    restarted = Bookie(bookie.config.with_changes(port=bookie.address.port), disk=FaultyDisk())
    await restarted.start()  # the journal replays: no gap, nothing refused
    try:
        conn = await BookieConnection.open(*restarted.address)
        assert [(await read(conn, ledger, e)).body is not None for e in (0, 2)] == [True] * 2
        conn.close()
    finally:
        await restarted.stop()
        MemoryKV.forget(uri[len("memory://") :])


@pytest.mark.timeout(60)
async def test_operators_force_read_only_and_lift_it(tmp_path: Path) -> None:
    bookie, uri = await _start(tmp_path, FaultyDisk())
    conn = await BookieConnection.open(*bookie.address)
    try:
        ledger = await _ledger(uri)  # the metadata must have it (the key check)
        state = await _state(conn, StateChange.READ_ONLY)
        assert state.writable == 0
        assert "operator" in state.reasons
        assert await _registered_state(uri, bookie) == READ_ONLY
        request = add_request(conn, ledger, 0, b"x")
        assert isinstance(request, AddRequest)
        assert (await conn.send(request, 10)).status is StatusCode.EREADONLY
        assert (await _state(conn, StateChange.WRITABLE)).writable == 1
        assert await _registered_state(uri, bookie) == WRITABLE
        assert (await add(conn, ledger, 0, b"x")).status is StatusCode.EOK
    finally:
        conn.close()
        await bookie.stop()
        MemoryKV.forget(uri[len("memory://") :])


@pytest.mark.timeout(60)
async def test_a_failing_checkpoint_is_counted_shown_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encoder error once stopped checkpoints with no log line and the counter at 0."""
    bookie, uri = await _start(tmp_path, FaultyDisk(), flush_interval=0.05)
    conn = await BookieConnection.open(*bookie.address)
    real = bookie.storage.checkpoint
    broken = True

    async def checkpoint(mark: int, start: tuple[int, int] | None = None) -> None:
        if broken:
            raise struct.error("'I' format requires 0 <= number <= 4294967295")
        await real(mark, start)

    monkeypatch.setattr(bookie.storage, "checkpoint", checkpoint)
    try:
        await wait_until(
            lambda: bookie.stats.checkpoint_failures >= 2,  # retried, and counted each time
            every=0.02,
            timeout=10,
            what="two checkpoint failures",
        )
        state = await _state(conn)
        assert "struct.error" in state.checkpoint_error
        broken = False
        await wait_until(  # retried within CHECKPOINT_RETRY, and the error is gone
            lambda: bookie.checkpoint_error is None, timeout=10, what="the checkpoint error gone"
        )
        assert (await _state(conn)).checkpoint_error == ""
    finally:
        conn.close()
        await bookie.stop()
        MemoryKV.forget(uri[len("memory://") :])


@pytest.mark.timeout(60)
async def test_a_bookie_starts_on_a_disk_with_no_byte_left(tmp_path: Path) -> None:
    """Something else took every byte, the reserve too: the bookie still starts (read-only,
    its journal without a file until there is room) and serves reads; once space is back it
    is writable again. Before: ``cannot start bookie: [Errno 28] No space left on device``."""
    disk = FaultyDisk()
    bookie, uri = await _start(tmp_path, disk, disk_check_interval=3600.0)
    conn = await BookieConnection.open(*bookie.address)
    ledger = await _ledger(uri)
    assert (await add(conn, ledger, 0, b"kept")).status is StatusCode.EOK
    conn.close()
    await bookie.crash()  # the UNCLEAN marker stays: nothing needs writing for it
    disk = FaultyDisk()
    disk.full = True
    again = Bookie(bookie.config.with_changes(port=bookie.address.port), disk=disk)
    await again.start()
    try:
        assert not again.write_state.writable
        assert again.journal.failed is not None
        conn = await BookieConnection.open(*again.address)
        assert (await read(conn, ledger, 0)).body is not None  # replayed, served
        assert (await add(conn, ledger, 1, b"refused")).status is StatusCode.EREADONLY
        disk.full = False
        await again.disk_monitor.check()
        assert again.write_state.writable, again.write_state.reasons
        assert (await add(conn, ledger, 1, b"after")).status is StatusCode.EOK
        conn.close()
    finally:
        await again.stop()
        MemoryKV.forget(uri[len("memory://") :])


async def _aiobk(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiobk", *args, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


@pytest.mark.timeout(90)
async def test_bookie_state_command(tmp_path: Path) -> None:
    disk = FaultyDisk()
    bookie, uri = await _start(tmp_path, disk, disk_reserved_space=0)
    address = str(bookie.address)
    try:
        code, out, _err = await _aiobk("bookie", "state", address, "--readonly", "--json")
        assert code == 0
        document = json.loads(out)
        assert document["state"] == "readonly"
        assert document["reasons"] == ["operator: set read-only by an operator"]
        assert not bookie.write_state.writable
        code, out, _err = await _aiobk("bookie", "state", address, "--writable")
        assert (code, out.strip()) == (0, f"{address}: writable")
        # A full disk keeps it read-only whatever the operator says, and the command says why.
        disk.free = 1 << 30  # 99.9% of the 1 TiB FaultyDisk reports
        await bookie.disk_monitor.check()
        code, out, err = await _aiobk("bookie", "state", address, "--writable")
        assert code != 0
        assert "stays read-only" in err
        assert "disk:" in err
        code, _out, err = await _aiobk("bookie", "state", "nonsense", "--readonly")
        assert code != 0
        assert "HOST:PORT" in err
    finally:
        await bookie.stop()
        MemoryKV.forget(uri[len("memory://") :])
