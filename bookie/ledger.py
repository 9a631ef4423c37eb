"""What a bookie knows of one ledger: its master key, fence and limbo bits, LAC, and where
each of its entries is stored.

Locations sit in pages of 4096 int64 slots (-1 = absent), like BookKeeper's index pages: dense
ledgers cost 8 bytes an entry, and a bookie holding only some entries (striping, a replacement
bookie starting mid-ledger) allocates only the pages it touches. Pages changed since the last
checkpoint are tracked so a checkpoint writes only those.
"""

from __future__ import annotations

import asyncio
from array import array

from bookie.sync_cursor import SyncCursor

PAGE_BITS = 12
PAGE_SIZE = 1 << PAGE_BITS
PAGE_MASK = PAGE_SIZE - 1
_EMPTY_PAGE = array("q", [-1]) * PAGE_SIZE


class LedgerState:
    __slots__ = (
        "dirty_pages",
        "fence_pending",
        "fenced",
        "key_pending",
        "lac",
        "ledger_id",
        "limbo",
        "master_key",
        "max_entry",
        "meta_dirty",
        "pages",
        "sync",
        "waiters",
    )

    def __init__(self, ledger_id: int, master_key: bytes) -> None:
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.fenced = False
        self.key_pending = False  # master key journaled but not synced yet
        self.limbo = False
        self.lac = -1  # max of piggybacked and explicit LACs seen
        self.sync = SyncCursor()  # BP-14: what this bookie has synced
        self.max_entry = -1
        self.pages: dict[int, array[int]] = {}
        self.dirty_pages: set[int] = set()
        self.meta_dirty = True
        self.waiters: list[asyncio.Future[None]] = []  # long polls waiting for the LAC to move
        # A fence journaled but not yet synced; its result is the journal's error, if any.
        self.fence_pending: asyncio.Future[BaseException | None] | None = None

    def location(self, entry_id: int) -> int:
        page = self.pages.get(entry_id >> PAGE_BITS)
        if page is None:
            return -1
        return page[entry_id & PAGE_MASK]

    def set_location(self, entry_id: int, location: int) -> None:
        number = entry_id >> PAGE_BITS
        page = self.pages.get(number)
        if page is None:
            page = self.pages[number] = array("q", _EMPTY_PAGE)
        page[entry_id & PAGE_MASK] = location
        self.dirty_pages.add(number)
        self.max_entry = max(self.max_entry, entry_id)

    @property
    def last_add_synced(self) -> int:
        return self.sync.last_add_synced

    def advance_lac(self, lac: int) -> bool:
        """Raise the LAC; wake long polls. True when it moved."""
        if lac <= self.lac:
            return False
        self.lac = lac
        self.meta_dirty = True
        waiters = self.waiters
        if waiters:
            self.waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        return True
