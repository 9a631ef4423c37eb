"""Ledger storage: entry logs for the bytes, the index for where they are and ledger state.

A checkpoint (BookKeeper's SyncThread) makes everything the journal has handed over durable
here, so the journal before it can go:

1. capture the index segment now, synchronously, with the journal LSN applied so far;
2. write and fsync every entry log byte appended so far (covers every captured location);
3. write the segment atomically.

The caller then releases journal files at or below that LSN.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.disk import Disk
from aiobk.bookie.entrylog import EntryLogger
from aiobk.bookie.index import IndexStore
from aiobk.bookie.ledger import LedgerState
from aiobk.bookie.stats import BookieStats


class LedgerStorage:
    def __init__(
        self,
        disk: Disk,
        config: BookieConfig,
        stats: BookieStats,
        on_write_error: Callable[[OSError], None] | None = None,
    ) -> None:
        base = config.ledgers_path
        self.entry_logger = EntryLogger(
            disk,
            os.path.join(base, "entries"),
            max_log_size=config.entry_log_max_size,
            write_buffer_size=config.entry_log_write_buffer,
            stats=stats,
            on_write_error=on_write_error,
        )
        self.index = IndexStore(disk, os.path.join(base, "index"), config.index_full_snapshot_every)
        self.ledgers: dict[int, LedgerState] = {}
        # Ledgers garbage collection dropped. Ids are never reused, so a request naming one is a
        # writer or a recovery that has not heard of the deletion: it must not bring the ledger
        # back (an add would be acknowledged into a ledger no reader can ever find). Kept in
        # FULL index segments, 8 bytes a ledger on disk.
        self.deleted: set[int] = set()
        self.stats = stats

    async def open(self) -> int:
        """Load the checkpointed index; return the journal LSN it covers."""
        loaded = await self.index.load()
        self.ledgers, self.deleted = loaded.ledgers, loaded.deleted
        await self.entry_logger.open()
        return loaded.mark

    def create(self, ledger_id: int, master_key: bytes) -> LedgerState:
        state = self.ledgers[ledger_id] = LedgerState(ledger_id, master_key)
        return state

    def delete_ledger(self, ledger_id: int) -> bool:
        """Forget a deleted ledger (garbage collection). Long polls on it end; the next index
        segment is a full one, so that no older segment brings it back after a restart."""
        state = self.ledgers.pop(ledger_id, None)
        if state is None:
            return False
        self.deleted.add(ledger_id)
        waiters, state.waiters = state.waiters, set()
        for waiter in waiters:
            waiter.wake()
        self.index.require_full()
        return True

    def add_entry(self, state: LedgerState, entry_id: int, body: bytes) -> None:
        state.set_location(entry_id, self.entry_logger.append(state.ledger_id, entry_id, body))

    async def read_entry(self, state: LedgerState, entry_id: int) -> bytes | None:
        """The stored body, None when absent; raises CorruptEntryError on a bad copy."""
        location = state.location(entry_id)
        if location < 0:
            return None
        return await self.entry_logger.read(location, state.ledger_id, entry_id)

    async def checkpoint(self, mark_lsn: int) -> None:
        snapshot = self.index.capture(mark_lsn, self.ledgers.values(), self.deleted)
        try:
            await self.entry_logger.sync()
            await self.index.write(snapshot)
        except BaseException:
            self.index.abandon()
            raise
        self.stats.checkpoints += 1

    async def close(self) -> None:
        await self.entry_logger.close()
