"""The journal's queue: records appended and not written yet, the callbacks that answer them,
and when the oldest was queued. The writer stage takes all of it at once as one batch;
``policy`` decides when from its size and age. It is plain data the writer owns, so appending
and taking each stay one call."""

from __future__ import annotations

import asyncio

from aiobk.bookie.journal.batch import Callback


class RecordQueue:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []  # encoded records; an item may hold several
        self.records = 0
        self.size = 0  # bytes
        self.callbacks: list[Callback] = []
        self.written: list[Callback] = []  # BP-14: run after the write, before the sync
        self.oldest = 0.0  # when the oldest callback was queued (the loop's clock)
        self.first_lsn: int | None = None

    def add(
        self,
        data: bytes,
        count: int,
        first_lsn: int,
        callback: Callback,
        on_written: Callback | None,
    ) -> None:
        """Queue ``count`` encoded records, the first with LSN ``first_lsn``."""
        if not self.callbacks:
            self.oldest = asyncio.get_running_loop().time()
        if self.first_lsn is None:
            self.first_lsn = first_lsn
        self.chunks.append(data)
        self.records += count
        self.callbacks.append(callback)
        if on_written is not None:
            self.written.append(on_written)
        self.size += len(data)

    def add_barrier(self, callback: Callback) -> None:
        """Queue a callback with no record: it runs once what is queued before it is synced."""
        if not self.callbacks:
            self.oldest = asyncio.get_running_loop().time()
        self.callbacks.append(callback)

    def take(self) -> tuple[bytes, int, list[Callback], list[Callback], int | None]:
        """Empty the queue; return its records' bytes, how many, the callbacks run after the
        sync, those run after the write, and the first record's LSN."""
        taken = b"".join(self.chunks), self.records, self.callbacks, self.written, self.first_lsn
        self.clear()
        return taken

    def clear(self) -> None:
        self.chunks, self.callbacks, self.written = [], [], []
        self.records = 0
        self.size = 0
        self.first_lsn = None
