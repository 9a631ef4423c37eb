"""What a bookie knows of one ledger: its master key, fence and limbo bits, LAC, and where
each of its entries is stored.

Locations sit in pages of 4096 slots, like BookKeeper's index pages. A page starts *sparse* (a
dict of the slots it holds) and becomes *dense* (4096 int64 slots, -1 = absent) once it holds
``SPARSE_MAX`` entries: a dense ledger then costs 8 bytes an entry, and one entry far from the
others (striping, a replacement bookie starting mid-ledger, or a peer adding at scattered ids)
costs a small dict, never a 32 KiB page. Pages changed since the last checkpoint are tracked so
a checkpoint writes only those.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Iterator
from typing import Protocol, TypeAlias

from aiobk.bookie.sync_cursor import SyncCursor

PAGE_BITS = 12
PAGE_SIZE = 1 << PAGE_BITS
PAGE_MASK = PAGE_SIZE - 1
_EMPTY_PAGE = array("q", [-1]) * PAGE_SIZE
# A sparse page turns dense at this many entries: measured, a dict of 256 locations takes
# 23 KiB (with its int objects), 360 would match the 32 KiB array.
SPARSE_MAX = 256
MAX_KEY_SIZE = 255  # what the index stores (a u8 length); the protocol allows 32 bytes

# Dense: slot -> location (-1 absent); sparse: only the slots present.
Page: TypeAlias = "array[int] | dict[int, int]"


def dense_page(sparse: dict[int, int]) -> array[int]:
    page = array("q", _EMPTY_PAGE)
    for slot, location in sparse.items():
        page[slot] = location
    return page


def page_items(page: Page) -> Iterator[tuple[int, int]]:
    """(slot, location) of every entry a page holds."""
    if isinstance(page, dict):
        return iter(page.items())
    return ((slot, location) for slot, location in enumerate(page) if location >= 0)


class Waiter(Protocol):
    """A long poll (``bookie.ops.read.LongPoll``): woken when the LAC moves."""

    def wake(self) -> None: ...


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
        if len(master_key) > MAX_KEY_SIZE:
            raise ValueError(f"master key of {len(master_key)} bytes exceeds {MAX_KEY_SIZE}")
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.fenced = False
        self.key_pending = False  # master key journaled but not synced yet
        self.limbo = False
        self.lac = -1  # max of piggybacked and explicit LACs seen
        self.sync = SyncCursor()  # BP-14: what this bookie has synced
        self.max_entry = -1
        self.pages: dict[int, Page] = {}
        self.dirty_pages: set[int] = set()
        self.meta_dirty = True
        self.waiters: set[Waiter] = set()  # long polls waiting for the LAC to move
        # A fence journaled but not yet synced; its result is the journal's error, if any.
        self.fence_pending: asyncio.Future[BaseException | None] | None = None

    def location(self, entry_id: int) -> int:
        page = self.pages.get(entry_id >> PAGE_BITS)
        if page is None:
            return -1
        if isinstance(page, dict):
            return page.get(entry_id & PAGE_MASK, -1)
        return page[entry_id & PAGE_MASK]

    def set_location(self, entry_id: int, location: int) -> None:
        number = entry_id >> PAGE_BITS
        slot = entry_id & PAGE_MASK
        page = self.pages.get(number)
        if page is None:
            self.pages[number] = {slot: location}
        elif isinstance(page, dict):
            page[slot] = location
            if len(page) >= SPARSE_MAX:
                self.pages[number] = dense_page(page)
        else:
            page[slot] = location
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
            self.waiters = set()
            for waiter in waiters:
                waiter.wake()
        return True
