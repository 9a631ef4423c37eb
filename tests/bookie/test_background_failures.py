"""A bookie's background work meeting a failure: the boot repair (BP-46 phase two) waits out a
journal that failed instead of ending with the ledger still in limbo, and a background task that
did fail is said at once and does not cut a stop short (found by the simulator: a full disk made
the repair's sync fail, and the crash that followed left the journal's tasks running). A stop
lets go of its port, connections, journal and disk although one of its steps fails, and a
connection accepted as it stops is dropped."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

import pytest

from aiobk.bookie import Bookie, BookieConfig
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.journal.policy import GroupCommitPolicy
from aiobk.bookie.ledgers import Ledgers
from aiobk.bookie.repair import repair
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.metadata import Fragment, LedgerMetadata, open_store
from aiobk.metadata import LedgerState as MetadataState
from tests.bookie.helpers import KEY
from tests.support.faulty_disk import FaultyDisk
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS
from tests.support.wait import wait_until

BOOKIE = "10.0.0.1:3181"


class _NoPeers:
    """A repairer for a closed empty ledger: nothing to recover or fetch."""

    def can_recover(self, metadata: LedgerMetadata) -> bool:
        return False

    async def recover(self, ledger_id: int, master_key: bytes) -> LedgerMetadata:
        raise AssertionError("a closed ledger is not recovered")

    async def fetch(self, metadata: LedgerMetadata, ledger_id: int, entry_id: int) -> bytes | None:
        raise AssertionError("a closed empty ledger has nothing to fetch")

    async def close(self) -> None:
        return None


@pytest.mark.timeout(60)
async def test_the_boot_repair_waits_out_a_failed_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = FaultyDisk()
    config = BookieConfig(data_dir=str(tmp_path), disk_reserved_space=0)
    stats = BookieStats()
    storage = LedgerStorage(disk, config, stats)
    journal = Journal(disk, config.journal_path, GroupCommitPolicy(), max_file_size=1 << 20)
    ledgers = Ledgers(storage, journal, stats)
    await disk.makedirs(config.ledgers_path)
    mark = await storage.open()
    await journal.replay(mark, ledgers.apply, storage.journal_start)
    await journal.start(mark + 1)
    store = open_store(f"memory://{unique_name('repair')}")
    closed = LedgerMetadata(
        1, 1, 1, (Fragment(0, (BOOKIE,)),), state=MetadataState.CLOSED, last_entry_id=-1
    )
    try:
        await store.create_ledger(7, closed)
        state, _status = ledgers.ensure(7, KEY)
        assert state is not None
        ledgers.set_limbo(state, True)
        await ledgers.durable()
        disk.sync_error = errno.EIO  # every fdatasync fails from here: the journal fails
        with caplog.at_level(logging.WARNING, logger="aiobk.bookie.repair"):
            task = asyncio.create_task(repair(ledgers, store, _NoPeers(), [7], BOOKIE, 0.01))
            await wait_until(
                lambda: (
                    journal.failed is not None
                    and any("ledger 7: repair postponed" in r.getMessage() for r in caplog.records)
                ),
                what="the journal failed and the repair postponed",
            )
        assert not task.done(), task  # postponed, not ended with the ledger in limbo
        disk.sync_error = 0
        assert await journal.recover()
        await asyncio.wait_for(task, 10)
        assert not state.limbo
    finally:
        disk.sync_error = 0
        await store.close()
        await journal.stop()
        await storage.close()
        await disk.close()


@pytest.mark.timeout(60)
async def test_a_failed_background_task_is_said_and_does_not_cut_a_stop_short(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = BookieConfig(data_dir=str(tmp_path / "b"), port=0, **HOST_DISK_SETTINGS)
    bookie = Bookie(config)
    await bookie.start()

    async def fails() -> None:
        raise OSError(errno.ENOSPC, "no space left on device")

    with caplog.at_level(logging.ERROR, logger="aiobk.bookie.background"):
        bookie.background.spawn("doomed", fails())
        await wait_until(
            lambda: any("bookie-doomed failed" in r.getMessage() for r in caplog.records),
            every=0,
            what=lambda: f"the doomed task's failure said: {caplog.text}",
        )
    await bookie.stop()  # raised the task's OSError before, leaving the journal running
    assert bookie.journal.failed is None
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("journal-")]


async def _refused(port: int) -> bool:
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


@pytest.mark.parametrize("how", ["stop", "crash"])
@pytest.mark.timeout(60)
async def test_a_step_that_fails_while_stopping_leaves_nothing_running(
    tmp_path: Path, how: str
) -> None:
    """The registry cannot be left and the index cannot be closed: the stop raises the first
    failure, but only after the port, the connections, the journal and the disk are let go."""
    config = BookieConfig(
        data_dir=str(tmp_path / "b"),
        port=0,
        metadata_uri=f"memory://{unique_name('teardown')}",
        **HOST_DISK_SETTINGS,
    )
    bookie = Bookie(config)
    await bookie.start()
    port = bookie.address.port
    _reader, client = await asyncio.open_connection("127.0.0.1", port)

    async def unreachable(clean: bool) -> None:
        raise OSError(errno.ETIMEDOUT, "metadata service unreachable")

    close_storage = bookie.storage.close

    async def index_fails() -> None:
        await close_storage()
        raise OSError(errno.EIO, "index database: I/O error")

    bookie.membership.close = unreachable  # type: ignore[method-assign]
    bookie.storage.close = index_fails  # type: ignore[method-assign]
    with pytest.raises(OSError, match="metadata service unreachable"):
        await (bookie.stop() if how == "stop" else bookie.crash())
    assert await _refused(port)
    assert await _reader.read() == b""  # the bookie's end of the connection is gone
    client.close()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("journal-")]
    with pytest.raises(RuntimeError):  # the disk's threads are shut down
        await bookie._disk.exists(str(tmp_path))


@pytest.mark.timeout(60)
async def test_a_connection_accepted_as_the_bookie_stops_is_dropped(tmp_path: Path) -> None:
    """Its ``connection_made`` comes after the stop closed every connection it knew of: the
    bookie drops it rather than leave it open with nothing to serve it."""
    config = BookieConfig(data_dir=str(tmp_path / "b"), port=0, **HOST_DISK_SETTINGS)
    bookie = Bookie(config)
    await bookie.start()
    try:
        bookie.flow.stop()  # the stop's first step; the listener is still open
        reader, writer = await asyncio.open_connection("127.0.0.1", bookie.address.port)
        try:
            assert await asyncio.wait_for(reader.read(), 10) == b""
        except ConnectionResetError:
            pass  # dropped with a reset: as good
        finally:
            writer.close()
        assert not bookie.flow.connections
    finally:
        await bookie.stop()
