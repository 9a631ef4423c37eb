"""Entry-log compaction: copy the live entries out of mostly-dead entry logs so that garbage
collection can remove them (BookKeeper's EntryLogCompactor, counting entries, not bytes).

Garbage collection removes an entry log once no ledger has an entry in it. A log shared with a
ledger that lives on would stay forever; compaction moves that ledger's entries in it to the
log taking appends, after which the old log is unreferenced. A complete log is compacted when
its live entries are under ``gc_compaction_threshold`` of its records.

Moving one entry: read it (CRC-checked) from its old location, append it again, and point the
index at the copy -- unless meanwhile the ledger was deleted or the entry written again, in
which case the newer state wins. An entry that cannot be read (damaged) keeps its log alive.
The caller (``bookie.gc``) then notes what still points into the compacted logs *before* it
checkpoints (the copies and the index that names them become durable together), and removes
the logs nothing pointed into.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiobk.bookie.entrylog import OFFSET_BITS, CorruptEntryError
from aiobk.bookie.ledger import PAGE_BITS, LedgerState, page_items
from aiobk.bookie.storage import LedgerStorage

PAGES_PER_YIELD = 16  # a few ms of work between yields to the event loop


@dataclass
class Relocation:
    moved: int = 0  # entries copied to the active log
    bytes: int = 0
    stuck: set[int] = field(default_factory=set)  # logs with an entry that could not be read


async def live_entries(ledgers: Iterable[LedgerState]) -> Counter[int]:
    """How many index locations point into each entry log (yields to the loop as it goes)."""
    live: Counter[int] = Counter()
    pages = 0
    for state in list(ledgers):
        for page in list(state.pages.values()):
            live.update(location >> OFFSET_BITS for _slot, location in page_items(page))
            pages += 1
            if pages % PAGES_PER_YIELD == 0:
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


async def relocate(storage: LedgerStorage, logs: set[int], flush_bytes: int) -> Relocation:
    """Copy every live entry held in ``logs`` to the active entry log and repoint the index."""
    targets: list[tuple[LedgerState, int, int]] = []
    pages = 0
    for state in list(storage.ledgers.values()):
        for number, page in list(state.pages.items()):
            pages += 1
            if pages % PAGES_PER_YIELD == 0:
                await asyncio.sleep(0)
            base = number << PAGE_BITS
            for slot, location in page_items(page):
                if location >> OFFSET_BITS in logs:
                    targets.append((state, base + slot, location))
    result = Relocation()
    logger = storage.entry_logger
    unflushed = 0
    for state, entry_id, location in targets:
        try:
            body = await logger.read(location, state.ledger_id, entry_id)
        except (CorruptEntryError, OSError):
            result.stuck.add(location >> OFFSET_BITS)
            continue
        current = storage.ledgers.get(state.ledger_id)
        if current is not state or state.location(entry_id) != location:
            continue  # deleted, or written again while we read: the newer state stands
        state.set_location(entry_id, logger.append(state.ledger_id, entry_id, body))
        result.moved += 1
        result.bytes += len(body)
        unflushed += len(body)
        if unflushed >= flush_bytes:  # bound the copies held in memory
            await logger.flush()
            unflushed = 0
    return result
