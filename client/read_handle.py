"""A ledger open for reading (``BookKeeper.open_ledger``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

from aiobk.client.context import ClientContext
from aiobk.client.entry import Entry
from aiobk.client.lac import long_poll_lac, read_lac_quorum
from aiobk.client.read import EntrySource
from aiobk.metadata import LedgerMetadata
from aiobk.protocol.errors import BKError, NoSuchEntryError, ReadTooLargeError

POLL_BACKOFF_MIN = 0.05  # seconds before polling again after an early answer without news
POLL_BACKOFF_MAX = 1.0


class ReadHandle:
    """A ledger open for reading, from ``BookKeeper.open_ledger``.

    Reads stop at the last add confirmed this handle knows (``read``, ``read_iter``), go past
    it on request (``read_unconfirmed``), or follow a live writer (``read_from``). Nothing is
    held on the bookies: ``close()`` and ``async with`` are for symmetry.

    Attributes:
        ledger_id: The ledger's id.
        metadata: Its metadata as last read.
    """

    def __init__(
        self,
        ctx: ClientContext,
        *,
        ledger_id: int,
        metadata: LedgerMetadata,
        reader: EntrySource,
        lac: int = -1,
    ) -> None:
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._reader = reader
        self._store = ctx.store
        self._pool = ctx.pool
        self._config = ctx.config
        self._lac = metadata.last_entry_id if metadata.last_entry_id is not None else lac

    @property
    def is_closed(self) -> bool:
        """Whether the ledger is closed in the metadata this handle last read."""
        return self.metadata.is_closed

    @property
    def last_add_confirmed(self) -> int:
        """The highest last add confirmed this handle has learnt; it never goes down. A closed
        ledger's is its last entry."""
        return self._lac

    def _advance(self, lac: int) -> int:
        self._lac = max(self._lac, lac)  # never goes down (invariant I9)
        return self._lac

    async def refresh(self) -> LedgerMetadata:
        """Read the ledger's metadata again; a close makes the LAC its last entry.

        Returns:
            The metadata read.
        """
        self.metadata = await self._store.read_ledger(self.ledger_id)
        if self.metadata.last_entry_id is not None:
            self._advance(self.metadata.last_entry_id)
        return self.metadata

    def _check_confirmed(self, first: int, last: int) -> None:
        if first < 0 or last < first:
            raise ValueError(f"bad range {first}..{last}")
        if last > self._lac:
            raise NoSuchEntryError(
                f"entry {last} is beyond the last add confirmed ({self._lac}) of ledger "
                f"{self.ledger_id}; use read_unconfirmed to read past it"
            )

    async def read(self, first: int, last: int) -> list[Entry]:
        """Read entries ``first..last`` (inclusive), all at or below the LAC this handle knows.

        Each entry is asked of one bookie of its write set at a time, moving to the next on an
        error, a timeout or a copy whose digest fails, and to the next speculatively when the
        first is slow.

        Args:
            first: The first entry id.
            last: The last entry id, at most ``last_add_confirmed``.

        Returns:
            The entries, in order.

        Raises:
            ValueError: Not a range.
            NoSuchEntryError: ``last`` is past the last add confirmed, or no bookie has an
                entry.
            ReadTooLargeError: The payloads pass ``ClientConfig.max_read_bytes`` (the list is
                held whole; ``read_iter`` streams any range).
            DigestMismatchError: No copy of an entry verifies.
        """
        self._check_confirmed(first, last)
        limit = self._config.max_read_bytes
        entries: list[Entry] = []
        total = 0
        stream = self._reader.iter_range(self.metadata, first, last)
        async with contextlib.aclosing(stream):
            async for entry in stream:
                total += len(entry.data)
                if total > limit:
                    raise ReadTooLargeError(
                        f"read({first}, {last}) of ledger {self.ledger_id} passes "
                        f"max_read_bytes ({limit} bytes) at entry {entry.entry_id}; stream the "
                        f"range with read_iter({first}, {last}) instead"
                    )
                entries.append(entry)
        return entries

    def read_iter(
        self, first: int, last: int, *, unconfirmed: bool = False
    ) -> AsyncGenerator[Entry, None]:
        """Stream entries ``first..last`` (inclusive), in order, one at a time.

        Fetches ahead of the consumer within ``read_concurrency`` entries and about
        ``read_ahead_bytes`` bytes, so memory stays flat whatever the range. Leaving the loop
        early: ``aclose()`` it (or use ``contextlib.aclosing``) to stop the fetches ahead at
        once.

        Args:
            first: The first entry id.
            last: The last entry id.
            unconfirmed: Allow a range past the LAC this handle knows (for a reader that
                learnt the LAC elsewhere); checked only to be a range.

        Returns:
            An async generator of the entries.

        Raises:
            ValueError: Not a range (at the call).
            NoSuchEntryError: ``last`` is past the last add confirmed (at the call), or no
                bookie has an entry (while iterating).
        """
        if not unconfirmed:
            self._check_confirmed(first, last)
        elif first < 0 or last < first:
            raise ValueError(f"bad range {first}..{last}")
        return self._reader.iter_range(self.metadata, first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[Entry]:
        """Read entries ``first..last`` even past the LAC, as far as bookies hold them.

        An entry past the LAC may still be lost by a recovery that has not seen it: use this
        only where that is acceptable (BookKeeper's ``readUnconfirmedEntries``).

        Args:
            first: The first entry id.
            last: The last entry id.

        Returns:
            The entries, in order.

        Raises:
            ValueError: Not a range.
            NoSuchEntryError: No bookie has one of them.
        """
        if first < 0 or last < first:
            raise ValueError(f"bad range {first}..{last}")
        return await self._reader.read_range(self.metadata, first, last)

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies of the last fragment for the LAC (a closed ledger's is its last
        entry, with no request).

        Returns:
            The LAC this handle now knows.

        Raises:
            BKError: Too few bookies answered.
        """
        if self.is_closed:
            return self._lac
        lac = await read_lac_quorum(self.ledger_id, self.metadata, self._pool, self._config)
        return self._advance(lac)

    async def wait_for_lac(self, previous_lac: int, timeout: float = 10.0) -> int:
        """Long poll: wait until the LAC passes ``previous_lac``, or for ``timeout``.

        Args:
            previous_lac: The LAC the caller knows.
            timeout: Seconds to wait at most.

        Returns:
            The LAC: above ``previous_lac`` when it moved, else ``previous_lac`` (a closed
            ledger ends the wait too).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        backoff = POLL_BACKOFF_MIN
        while self._lac <= previous_lac and not self.is_closed:
            started = loop.time()
            left = deadline - started
            if left <= 0:
                break
            wait = min(left, self._config.long_poll_timeout)
            lac = await long_poll_lac(
                self.ledger_id, self.metadata, previous_lac, wait, self._pool, self._config
            )
            self._advance(lac)
            if self._lac <= previous_lac:
                await self.refresh()  # a closed (or re-ensembled) ledger stops the wait
                if not self.is_closed and loop.time() - started < wait / 2:
                    # Answered early without news (bookies down or refusing): wait before
                    # asking again rather than spinning until the deadline.
                    await asyncio.sleep(min(backoff, max(0.0, deadline - loop.time())))
                    backoff = min(backoff * 2, POLL_BACKOFF_MAX)
        return max(self._lac, previous_lac)

    async def read_from(self, first: int = 0) -> AsyncIterator[Entry]:
        """Every entry from ``first`` on, following the tail with long polls until the ledger
        is closed and fully read.

        The ledger's metadata is watched meanwhile, so a close (a log rolling to its next
        ledger, a recovery) ends the wait at once rather than after a long poll times out.

        Args:
            first: The first entry id.

        Yields:
            The entries, in order, as they are confirmed.
        """
        next_entry = first
        closed = asyncio.Event()
        watcher = asyncio.ensure_future(self._watch_close(closed))
        try:
            while True:
                if next_entry <= self._lac:
                    # Streamed up to the LAC known now (flat memory); then look again.
                    stream = self._reader.iter_range(self.metadata, next_entry, self._lac)
                    async with contextlib.aclosing(stream):
                        async for entry in stream:
                            yield entry
                            next_entry = entry.entry_id + 1
                    continue
                if self.is_closed:
                    return
                await self._wait_or_close(next_entry - 1, closed)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _watch_close(self, closed: asyncio.Event) -> None:
        try:
            async for metadata in self._store.watch_ledger(self.ledger_id):
                if metadata is not None and metadata.is_closed:
                    self.metadata = metadata
                    if metadata.last_entry_id is not None:
                        self._advance(metadata.last_entry_id)
                    closed.set()
                    return
        except BKError:
            return  # no watch: the long polls still notice the close, only later

    async def _wait_or_close(self, previous: int, closed: asyncio.Event) -> None:
        poll = asyncio.ensure_future(self.wait_for_lac(previous, self._config.long_poll_timeout))
        if closed.is_set():
            await poll
            return
        closing = asyncio.ensure_future(closed.wait())
        try:
            await asyncio.wait({poll, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (poll, closing):
                if not task.done():
                    task.cancel()
            await asyncio.gather(poll, closing, return_exceptions=True)
        if poll.done() and not poll.cancelled() and poll.exception() is not None:
            raise poll.exception()  # type: ignore[misc]

    async def close(self) -> None:
        """Nothing to release on the bookies; present for symmetry with LedgerHandle."""

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"ReadHandle({self.ledger_id}, lac={self._lac}, {self.metadata!r})"
