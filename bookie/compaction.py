"""Entry-log compaction: copy the live entries out of mostly-dead entry logs so that garbage
collection can remove them (BookKeeper's EntryLogCompactor, counting entries, not bytes).

Garbage collection removes an entry log once every ledger it holds is deleted. A log shared
with a ledger that lives on would stay forever; compaction moves that ledger's entries in it to
the log taking appends, after which the old log is unreferenced. A complete log is compacted
when its live entries are under ``gc_compaction_threshold`` of its records.

Which entries are live comes from the index (``bookie.index.entry_index``): per log, the ledgers it
holds and how many entries each appended there (``log_usage``); moving walks the log's records
in file order (``EntryLogger.records``) and moves a record only if the index still points at it
-- so neither a ledger deleted meanwhile nor an entry written again is brought back -- into the
write cache, which the next checkpoint commits in one batch with the copies synced before it.
The caller (``bookie.gc``) then checks that nothing points into the compacted logs
(``references``) and removes them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiobk.bookie.entrylog.format import OFFSET_BITS, pack_location
from aiobk.bookie.gc_report import GcProgress
from aiobk.bookie.index.entry_index import EntryIndex
from aiobk.bookie.storage import LedgerStorage

RECORDS_PER_YIELD = 256  # a few ms of work between yields to the event loop


@dataclass
class Relocation:
    moved: int = 0  # entries copied to the active log
    bytes: int = 0
    stuck: set[int] = field(default_factory=set)  # logs with an entry that could not be read


def held(index: EntryIndex, ledger_id: int) -> bool:
    return index.state(ledger_id) is not None


async def log_usage(index: EntryIndex, logs: Iterable[int]) -> Counter[int]:
    """Entries appended to each log by ledgers still held (a log at 0 can go). Entries written
    again elsewhere count until their ledger goes: the figure errs toward keeping a log."""
    live: Counter[int] = Counter()
    checked = 0
    for log_id in logs:
        live[log_id] += 0
        for ledger_id, count in index.log_ledgers(log_id):
            if held(index, ledger_id):
                live[log_id] += count
            checked += 1
            if checked % RECORDS_PER_YIELD == 0:
                await asyncio.sleep(0)
    return live


def compaction_candidates(
    live: Counter[int], records: dict[int, int], threshold: float, limit: int
) -> list[int]:
    """Logs whose live share of records is under ``threshold``, emptiest first, at most
    ``limit`` of them. Logs with no live entry are not candidates: gc removes them as they are."""
    ratios = [
        (live[log_id] / count, log_id)
        for log_id, count in records.items()
        if count > 0 and 0 < live[log_id] < threshold * count
    ]
    return [log_id for _ratio, log_id in sorted(ratios)[:limit]]


async def relocate(
    storage: LedgerStorage,
    logs: Iterable[int],
    flush_bytes: int,
    progress: GcProgress | None = None,
) -> Relocation:
    """Copy every entry the index still locates in ``logs`` to the active entry log and repoint
    the index at the copies (in the write cache: one batch at the next checkpoint);
    ``progress`` follows it."""
    result = Relocation()
    logger, index = storage.entry_logger, storage.index
    unflushed = walked = 0
    for log_id in sorted(logs):
        if progress is not None:
            progress.compacting, progress.bytes_scanned = log_id, 0
            progress.log_bytes = await logger.log_size(log_id)
        async for offset, ledger_id, entry_id, body in logger.records(log_id):
            walked += 1
            if progress is not None:
                progress.bytes_scanned = offset
            if walked % RECORDS_PER_YIELD == 0:
                await asyncio.sleep(0)
            if index.location(ledger_id, entry_id) != pack_location(log_id, offset):
                continue  # dead: deleted, or written again elsewhere
            if not held(index, ledger_id):
                continue
            index.cache.put_location(ledger_id, entry_id, logger.append(ledger_id, entry_id, body))
            result.moved += 1
            result.bytes += len(body)
            if progress is not None:
                progress.entries_moved += 1
                progress.bytes_moved += len(body)
            unflushed += len(body)
            if unflushed >= flush_bytes:  # bound the copies held in memory
                await logger.flush()
                unflushed = 0
    return result


async def references(index: EntryIndex, log_id: int) -> int:
    """How many index locations point into the log, counted over the ledgers it holds that
    are still held (a damaged record compaction could not move keeps its log)."""
    count = 0
    for ledger_id, _appended in list(index.log_ledgers(log_id)):
        for _entry_id, location in index.entries(ledger_id):
            if location >> OFFSET_BITS == log_id:
                count += 1
        await asyncio.sleep(0)
    return count
