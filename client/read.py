"""Reading entries ("A Guide to the BookKeeper Replication Protocol", "Reading from ledgers": a
regular read needs one positive answer).

An entry is asked of the bookies of its write set (in its fragment) in order, speculatively:
the first good copy wins. A copy whose digest does not verify is skipped (``DigestMismatchError`` if
no good copy turns up). When every bookie fails the error says why: all explicit negatives ->
``NoSuchEntryError``; a limbo bookie -> ``DataUnknownError``; otherwise the last transport or
status error.

Ranges are streamed (``iter_range``): entries are fetched ahead of the consumer in a window
bounded by ``read_concurrency`` entries and by ``read_ahead_bytes`` -- the entries in the window
counted at the largest size seen so far, the first one fetched alone to learn it -- and handed
over in order. At least one entry is always in flight, so an entry larger than the byte bound
is still read.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol, TypeVar

from aiobk.client.config import ClientConfig
from aiobk.client.connection import status_error
from aiobk.client.digest import Digester
from aiobk.client.entry import Entry
from aiobk.client.entry_read import ask, verified
from aiobk.client.pool import BookiePool
from aiobk.client.quorum import write_set
from aiobk.client.stats import ClientStats
from aiobk.metadata import LedgerMetadata
from aiobk.protocol import (
    EntryBody,
    StatusCode,
)
from aiobk.protocol.errors import (
    BKError,
    DataUnknownError,
    DigestMismatchError,
    NoSuchEntryError,
)
from aiobk.tasks import cancel_all

_T = TypeVar("_T")


def summarize(ledger_id: int, entry_id: int, errors: list[BKError]) -> BKError:
    if not errors:
        return NoSuchEntryError(f"entry {ledger_id}/{entry_id}: no bookie to ask")
    if all(e.code in (StatusCode.ENOENTRY, StatusCode.ENOLEDGER) for e in errors):
        return NoSuchEntryError(f"no bookie has entry {ledger_id}/{entry_id}")
    for kind in (DigestMismatchError, DataUnknownError):
        for error in errors:
            if isinstance(error, kind):
                return error
    return errors[-1]


class EntrySource(Protocol):
    """Where a read handle's entries come from: the bookies (``EntryReader``), or an
    offloaded ledger's object (``client.store_read``)."""

    def iter_range(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> AsyncGenerator[Entry, None]: ...

    async def read_range(self, metadata: LedgerMetadata, first: int, last: int) -> list[Entry]: ...


class EntryReader:
    def __init__(
        self,
        ledger_id: int,
        digest: Digester,
        pool: BookiePool,
        config: ClientConfig,
        stats: ClientStats | None = None,
    ) -> None:
        self.ledger_id = ledger_id
        self._digest = digest
        self._pool = pool
        self._config = config
        self._stats = stats or ClientStats()  # counted: entries read, speculative reads

    async def fetch(self, metadata: LedgerMetadata, entry_id: int) -> EntryBody:
        """The entry's verified body from the first bookie of its write set with a good copy.

        Bookies are asked in write-set order (those in the client's rack, then its zone,
        first: ``ClientConfig.rack``); one that has not answered after
        ``speculative_read_timeout`` keeps its request but the next one is asked as well, so a
        silent bookie costs a short delay rather than a full read timeout."""
        fragment = metadata.fragment_for(entry_id)
        slots = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
        bookies = self._pool.read_order([fragment.ensemble[s] for s in slots])
        errors: list[BKError] = []
        running: set[asyncio.Task[EntryBody]] = set()
        asked: list[asyncio.Task[EntryBody]] = []  # the order to look at them in (not a set's)
        try:
            for index in range(len(bookies) + 1):
                if index < len(bookies):
                    asked.append(asyncio.ensure_future(self._ask(bookies[index], entry_id)))
                    running.add(asked[-1])
                    wait = self._config.speculative_read_timeout
                else:
                    wait = None  # everyone has been asked: wait for the rest
                while running:
                    done, running = await asyncio.wait(
                        running, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                    )
                    if not done:
                        if index + 1 < len(bookies):
                            self._stats.speculative_reads += 1
                        break  # speculative timeout: ask the next bookie too
                    found: EntryBody | None = None
                    for task in (task for task in asked if task in done):  # each one looked at:
                        error = task.exception()  # none left with an unread error
                        if error is None:
                            if found is None:
                                found = task.result()
                        else:
                            assert isinstance(error, BKError)
                            errors.append(error)
                    if found is not None:
                        self._stats.entries_read += 1
                        return found
                    if index < len(bookies):
                        break  # a failure: move on to the next bookie at once
            raise summarize(self.ledger_id, entry_id, errors)
        finally:
            await cancel_all([task for task in asked if task in running])

    async def _ask(self, bookie: str, entry_id: int) -> EntryBody:
        response = await ask(
            self._pool, bookie, self.ledger_id, entry_id, self._config.read_timeout
        )
        if response.status is not StatusCode.EOK or response.body is None:
            raise status_error(response, bookie)
        return verified(response.body, self._digest, self.ledger_id, entry_id, bookie)

    async def read_one(self, metadata: LedgerMetadata, entry_id: int) -> Entry:
        body = await self.fetch(metadata, entry_id)
        return Entry(self.ledger_id, entry_id, body.payload)

    def iter_range(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> AsyncGenerator[Entry, None]:
        """Entries first..last inclusive, in order, fetched ahead within the window."""
        return self._ahead(first, last, functools.partial(self.read_one, metadata), _data_size)

    def iter_bodies(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> AsyncGenerator[EntryBody, None]:
        """The verified bodies of entries first..last, as ``iter_range`` fetches them: what
        a copy of the ledger (an offload) keeps, digest and all."""
        return self._ahead(first, last, functools.partial(self.fetch, metadata), _body_size)

    async def _ahead(
        self,
        first: int,
        last: int,
        fetch: Callable[[int], Awaitable[_T]],
        size: Callable[[_T], int],
    ) -> AsyncGenerator[_T, None]:
        window = self._config.read_concurrency
        ahead = self._config.read_ahead_bytes
        fetching: deque[asyncio.Future[_T]] = deque()  # in entry order
        largest = -1  # size of the largest entry seen; -1: none seen yet
        next_id = first
        try:
            while fetching or next_id <= last:
                while next_id <= last and len(fetching) < window:
                    if fetching and (largest < 0 or (len(fetching) + 1) * largest > ahead):
                        break  # the window's bytes (at the largest size seen) are spent
                    fetching.append(asyncio.ensure_future(fetch(next_id)))
                    next_id += 1
                item = await fetching[0]
                fetching.popleft()
                largest = max(largest, size(item))
                yield item
        finally:
            await cancel_all(fetching)

    async def read_range(self, metadata: LedgerMetadata, first: int, last: int) -> list[Entry]:
        """Entries first..last inclusive, in order (all of them in memory: see iter_range)."""
        return [entry async for entry in self.iter_range(metadata, first, last)]


def _data_size(entry: Entry) -> int:
    return len(entry.data)


def _body_size(body: EntryBody) -> int:
    return len(body.payload)
