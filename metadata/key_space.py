"""One prefix of one ``KV``: its key layout, the watches open on it, and the two ways of reading
it the record families share (a prefix page by page; one key followed through its changes).

``MetadataStore`` is built from one family per part (ledgers and the cluster in ``store``,
bookies and cookies in ``bookie_records``, logs in ``log_records``); each part reads and writes
only its own keys, through this base.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from aiobk.metadata.keys import KeyLayout
from aiobk.metadata.kv import KV, KeyValue, Watch, WatchCompactedError


class KeySpace:
    """The ``KV`` under one prefix, with the watches opened on it (closed with the store)."""

    def __init__(self, kv: KV, keys: KeyLayout) -> None:
        self.kv = kv
        self.keys = keys
        self._watches: dict[Watch, None] = {}  # ordered: notified as opened

    async def _pages(self, prefix: bytes, size: int = 1000) -> AsyncIterator[list[KeyValue]]:
        """Every key under ``prefix`` with its value, ``size`` at a time, in key order. The
        caller reads to the end: a page shorter than ``size`` is the last."""
        after: bytes | None = None
        while True:
            page, _revision = await self.kv.range(prefix, after, size)
            yield page
            if len(page) < size:
                return
            after = page[-1].key

    async def _follow(self, key: bytes) -> AsyncGenerator[KeyValue | None, None]:
        """The key now (None: absent), then after every change.

        A watch that falls behind the store's compaction (its stream broke, and the changes it
        missed were compacted meanwhile: ``WatchCompactedError``) cannot resume where it was:
        the key is read again, yielded if it is not the state last yielded, and watched on
        from that read. The owner may then miss states in between, never the latest one."""
        found, revision = await self.kv.get(key)
        last: int | None = -1  # mod revision of the state last yielded (None: absent)
        while True:
            watch = await self.kv.watch(key, prefix=False, start_revision=revision + 1)
            self._watches[watch] = None
            try:
                now = found.mod_revision if found is not None else None
                if now != last:
                    last = now
                    yield found
                async for event in watch:
                    found = (
                        None
                        if event.value is None
                        else KeyValue(event.key, event.value, event.revision)
                    )
                    last = event.revision if found is not None else None
                    yield found
                return  # closed with the store
            except WatchCompactedError:
                pass
            finally:
                self._watches.pop(watch, None)
                await watch.close()
            found, revision = await self.kv.get(key)
