"""Upgrading a data directory written before the on-disk index: index segments
(``ledgers/index/*.idx``, format 1 or 2, ``bookie.upgrade.segments``) become the on-disk index
(``bookie.index.entry_index``) at start.

Theory of operation. The segments are loaded as the old bookie loaded them (that one time, the
memory the old format needed), then written to the new index in batches of ``BATCH_KEYS`` keys
with absolute values, so writing them again is harmless. The last batch carries the journal LSN
the segments covered: until it is durable the new index has no mark, and a start that finds
segments and no mark converts again from the beginning (a crash mid-way loses nothing). Only
after that batch is durable are the segments removed; a start that finds segments *and* a mark
finishes that removal.
"""

from __future__ import annotations

import logging
import os
from collections import Counter

from aiobk.bookie.disk import Disk
from aiobk.bookie.entrylog.format import OFFSET_BITS
from aiobk.bookie.index.engine import IndexBatch
from aiobk.bookie.index.entry_index import (
    HELD_KEY,
    VALUE,
    EntryIndex,
    LedgerRecord,
    deleted_key,
    location_key,
    log_key,
    put_mark,
    put_record,
)
from aiobk.bookie.upgrade.segments import SUFFIX, IndexStore, PagedLedger

log = logging.getLogger(__name__)

LEGACY_DIR = "index"
BATCH_KEYS = 100_000


async def legacy_segments(disk: Disk, base: str) -> list[str]:
    directory = os.path.join(base, LEGACY_DIR)
    if not await disk.exists(directory):
        return []
    return sorted(n for n in await disk.listdir(directory) if n.endswith(SUFFIX))


async def upgrade_legacy_index(disk: Disk, base: str, index: EntryIndex) -> bool:
    """Convert the segments under ``base`` into ``index`` if there are any; True if it did."""
    segments = await legacy_segments(disk, base)
    if not segments:
        return False
    directory = os.path.join(base, LEGACY_DIR)
    if index.mark() < 0:
        loaded = await IndexStore(disk, directory, full_every=1).load()
        ledgers, entries = await _convert(index, loaded.ledgers, loaded.deleted, loaded.mark)
        log.warning(
            "upgraded the ledger index in %s: %d ledgers, %d entries, %d deleted ledgers, "
            "journal LSN %d; the old index segments are removed",
            directory,
            ledgers,
            entries,
            len(loaded.deleted),
            loaded.mark,
        )
    for name in segments:
        await disk.remove(os.path.join(directory, name))
    await disk.sync_dir(directory)
    return True


async def _convert(
    index: EntryIndex, ledgers: dict[int, PagedLedger], deleted: set[int], mark: int
) -> tuple[int, int]:
    db = index.db
    batch = IndexBatch()
    entries = 0
    for ledger_id in sorted(ledgers):
        state = ledgers[ledger_id]
        logs: Counter[int] = Counter()
        for entry_id, location in state.entries():
            batch.put(location_key(ledger_id, entry_id), VALUE.pack(location))
            logs[location >> OFFSET_BITS] += 1
            entries += 1
        for log_id, count in logs.items():
            batch.put(log_key(log_id, ledger_id), VALUE.pack(count))
        record = LedgerRecord(
            state.master_key, state.fenced, state.limbo, state.lac, state.max_entry
        )
        put_record(batch, ledger_id, record)
        if len(batch) >= BATCH_KEYS:
            await db.write(batch)
            batch = IndexBatch()
    for ledger_id in sorted(deleted):
        batch.put(deleted_key(ledger_id), b"")
    batch.put(HELD_KEY, VALUE.pack(len(ledgers)))
    put_mark(batch, mark)  # last: the conversion is done once this is durable
    await db.write(batch)
    return len(ledgers), entries


__all__ = ["legacy_segments", "upgrade_legacy_index"]
