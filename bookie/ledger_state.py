"""What a bookie knows of one ledger while it is in use: its master key, fence and limbo bits,
LAC, BP-14 sync cursor and long polls. Where its entries are stored lives in the on-disk index
(``bookie.index.entry_index``), which this object reads and writes through.

A state is materialized from the index when a request names its ledger and dropped again once it
is idle and its record is durable (``bookie.storage``), so memory follows the ledgers in use,
not the ledgers held.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Sequence
from typing import Protocol

from aiobk.bookie.index.entry_index import EntryIndex, LedgerRecord
from aiobk.bookie.sync_cursor import SyncCursor

MAX_KEY_SIZE = 255  # what the index stores (a u8 length); the protocol allows 32 bytes


_ORDER = itertools.count()  # ties in the polls' heap: never compare the polls themselves


class Waiter(Protocol):
    """A long poll (``bookie.ops.read.LongPoll``): woken once the LAC passes ``previous_lac``."""

    @property
    def previous_lac(self) -> int: ...

    def wake(self) -> None: ...


class LedgerState:
    __slots__ = (
        "_due",
        "_loaded_max",
        "_sync",
        "fence_pending",
        "fenced",
        "index",
        "key_pending",
        "lac",
        "ledger_id",
        "limbo",
        "master_key",
        "max_entry",
        "meta_dirty",
        "waiters",
    )

    def __init__(self, ledger_id: int, master_key: bytes, index: EntryIndex) -> None:
        if len(master_key) > MAX_KEY_SIZE:
            raise ValueError(f"master key of {len(master_key)} bytes exceeds {MAX_KEY_SIZE}")
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.index = index
        self.fenced = False
        self.key_pending = False  # master key journaled but not synced yet
        self.limbo = False
        self.lac = -1  # max of piggybacked and explicit LACs seen
        self._sync: SyncCursor | None = SyncCursor()  # BP-14; None: built on first use
        self._loaded_max = -1  # loaded states: entries up to here, where stored, are synced
        self.max_entry = -1
        self.meta_dirty = True  # the index's record of it is out of date
        self.waiters: set[Waiter] = set()  # long polls waiting for the LAC to move
        # The same polls by the LAC each waits to pass (a heap; entries of polls that left
        # are skipped when reached, and dropped when they outnumber the polls waiting).
        self._due: list[tuple[int, int, Waiter]] | None = None
        # A fence journaled but not yet synced; its result is the journal's error, if any.
        self.fence_pending: asyncio.Future[BaseException | None] | None = None

    @classmethod
    def loaded(cls, ledger_id: int, record: LedgerRecord, index: EntryIndex) -> LedgerState:
        """A state from its durable record (a plain read needs nothing more: one lookup)."""
        state = cls(ledger_id, record.master_key, index)
        state.fenced, state.limbo = record.fenced, record.limbo
        state.lac, state.max_entry = record.lac, record.max_entry
        state.meta_dirty = False
        state._sync = None
        state._loaded_max = record.max_entry
        return state

    @property
    def sync(self) -> SyncCursor:
        """BP-14's cursor. A loaded state builds it on first use: every entry its record covered
        is synced (the record was durable with them), so the cursor starts at the LAC and takes
        each entry stored above it, up to the record's max entry -- not beyond, where an add
        made since may not be synced yet."""
        sync = self._sync
        if sync is None:
            sync = self._sync = SyncCursor()
            sync.confirmed(self.lac)
            entry = self.lac + 1
            while entry <= self._loaded_max and self.location(entry) >= 0:
                sync.synced(entry)
                entry += 1
        return sync

    def record(self) -> LedgerRecord:
        return LedgerRecord(self.master_key, self.fenced, self.limbo, self.lac, self.max_entry)

    @property
    def idle(self) -> bool:
        """Nothing but the index needs this object: it may be dropped and loaded again."""
        return not (
            self.meta_dirty
            or self.waiters
            or self.key_pending
            or self.fence_pending is not None
            or (self._sync is not None and self._sync.ranges)
        )

    def location(self, entry_id: int) -> int:
        return self.index.location(self.ledger_id, entry_id)

    def locations(self, first: int, last: int) -> list[int]:
        """``location`` of entries ``first``.. on, ending before the first one not held."""
        return self.index.locations(self.ledger_id, first, last)

    def set_location(self, entry_id: int, location: int) -> None:
        self.index.cache.put_location(self.ledger_id, entry_id, location)
        self.max_entry = max(self.max_entry, entry_id)
        self.meta_dirty = True

    def set_locations(self, entry_ids: Sequence[int], locations: Sequence[int]) -> None:
        """``set_location`` of each of the entries, given in increasing order."""
        self.index.cache.put_locations(self.ledger_id, entry_ids, locations)
        self.max_entry = max(self.max_entry, entry_ids[-1])
        self.meta_dirty = True

    @property
    def last_add_synced(self) -> int:
        return self.sync.last_add_synced

    def advance_lac(self, lac: int) -> bool:
        """Raise the LAC; wake long polls. True when it moved."""
        if lac <= self.lac:
            return False
        self.lac = lac
        self.meta_dirty = True
        # Only the polls the LAC now passes: one waiting for more than this keeps waiting
        # (answering it would send its client a LAC it already had, and a new poll after it).
        # Popped from the heap: an advance costs the polls it answers, not all that wait.
        due, waiters = self._due, self.waiters
        while due and due[0][0] < lac:
            waiter = heapq.heappop(due)[2]
            if waiter in waiters:
                waiters.discard(waiter)
                waiter.wake()
        return True

    def add_waiter(self, waiter: Waiter) -> None:
        self.waiters.add(waiter)
        due = self._due
        if due is None:
            due = self._due = []
        elif len(due) > 2 * len(self.waiters) + 64:  # mostly polls that left: rebuild
            due[:] = [entry for entry in due if entry[2] in self.waiters and entry[2] is not waiter]
            heapq.heapify(due)
        heapq.heappush(due, (waiter.previous_lac, next(_ORDER), waiter))

    def remove_waiter(self, waiter: Waiter) -> None:
        self.waiters.discard(waiter)
        if not self.waiters:
            self._due = None
