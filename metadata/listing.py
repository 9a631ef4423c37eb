"""Listing keys named by ledger id -- the ledgers, the under-replication marks -- a page at a
time, without etcd counting the rest of the range for every page.

etcd counts every key of a range to its end even when a limit cuts the answer short (3.4
gathers them all first), so paging a million keys by limit alone costs a million keys a page (a
GC pass's listing of the ledgers took minutes; the auditor's pass over 333,000 marks at 500 a
page counted 1.1e8). Ledger ids are etcd revisions (``MetadataStore.allocate_ledger_id``), none
past the store's revision read first, and a mark is named by its ledger's id: the walk goes
through windows of ids from the start up to that revision, each range ending at its window. A
window that comes back sparse doubles the next one (a long stretch of unused ids costs a few
empty calls). One that fills a page was too wide for the ids there: the walk goes on right
after the page's last key with the width that page took, so a dense run is not counted again
page after page. Then one last range takes any key past the revision (a ledger made with an id
of its own choosing, or its mark).

What a single call counts is bounded by the keys in its window: a page or so where the ids are
evenly spread; more once, where the walk, widened over a long sparse stretch, meets a dense run
(etcd cannot find the first key of a range without counting the range). Over the whole walk a
key is counted a few times (two to three in ``tests/metadata/test_listing_cost.py`` and
``test_marks_listing_cost.py``), not once for every page before it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from aiobk.metadata.keys import KeyLayout
from aiobk.metadata.kv import KV, KeyValue


async def walk_ids(
    kv: KV,
    prefix: bytes,
    key_of: Callable[[int], bytes],
    page_size: int,
    *,
    keys_only: bool,
    after: int | None = None,
) -> AsyncGenerator[KeyValue, None]:
    """The keys under ``prefix``, each ``key_of(id)`` for an id, in id order (those past id
    ``after`` only, when given), a page of at most ``page_size`` at a time."""
    _found, revision = await kv.get(prefix)  # any read tells the store's revision
    sparse = max(1, page_size // 4)  # fewer keys than this in a window: widen the next
    low = 0 if after is None else after + 1
    window = page_size
    start = None if after is None else key_of(after)
    while low <= revision:
        high = min(low + window, revision + 1)
        page, _rev = await kv.range(prefix, start, page_size, keys_only=keys_only, end=key_of(high))
        for item in page:
            yield item
        if len(page) == page_size:  # more in this window: on from the page's last key
            last = KeyLayout.ledger_id_of(prefix, page[-1].key)
            window = last + 1 - low  # >= page_size: ids are unique
            low = last + 1
        else:
            low = high
            if len(page) < sparse:
                window *= 2
        start = key_of(low - 1) if low > 0 else None
    while True:  # keys with ids past the revision (ledgers created with an id of their choice)
        page, _rev = await kv.range(prefix, start, page_size, keys_only=keys_only)
        for item in page:
            yield item
        if len(page) < page_size:
            return
        start = page[-1].key
