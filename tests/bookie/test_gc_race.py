"""Garbage collection beside appends: a pass judges which entry logs are empty from the index it
has just checkpointed, so a log that received entries after that checkpoint sealed the index
must not be judged at all (gc.py, step 4)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from aiobk.bookie.entrylog.logger import EntryLogger
from tests.bookie.test_gc import SMALL_LOGS, _check, _fill, _one_bookie


@pytest.mark.timeout(60)
async def test_a_log_filled_while_a_pass_checkpoints_is_not_taken_for_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A make test run lost acknowledged entries this way: the pass's first checkpoint sealed the
    # index, a slow entry-log fsync let a ledger's first entries fill log 0 and roll it, and the
    # pass then found log 0 complete with no ledger in the index's per-log lists -- and removed it.
    settings = {**SMALL_LOGS, "flush_interval": 3600.0}  # no checkpoint but the pass's
    async with _one_bookie(tmp_path, **settings) as (cluster, bk):
        bookie = cluster.bookies[0]
        logger = bookie.storage.entry_logger
        sealed, release = asyncio.Event(), asyncio.Event()
        real_sync: Callable[[EntryLogger], Awaitable[None]] = EntryLogger.sync

        async def held_sync(self: EntryLogger) -> None:
            if not sealed.is_set():  # the pass's first checkpoint: the index is sealed by now
                sealed.set()
                await release.wait()
            await real_sync(self)

        monkeypatch.setattr(EntryLogger, "sync", held_sync)
        first_log = logger.active_log
        keep = await bk.create_ledger(1, 1, 1)
        gc_pass = asyncio.create_task(bookie.collect_garbage())
        async with asyncio.timeout(10):
            await sealed.wait()
        await _fill(keep, b"k", 40)  # 40 KiB into 16 KiB logs: the pass's first log is rolled
        assert logger.active_log > first_log
        release.set()
        result = await gc_pass
        assert result.skipped == ""
        assert result.logs_removed == []
        await _check(keep.ledger_id, bk, 40, b"k")
        again = await bookie.collect_garbage()  # the next pass sees them in the index
        assert again.logs_removed == []
        await _check(keep.ledger_id, bk, 40, b"k")
