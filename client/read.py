"""Reading entries (the guide's "Reading from ledgers": a regular read needs one positive answer).

An entry is asked of the bookies of its write set (in its fragment) in order, speculatively:
the first good copy wins. A copy whose digest does not verify is skipped (``DigestMismatchError`` if
no good copy turns up). When every bookie fails the error says why: all explicit negatives ->
``NoSuchEntryError``; a limbo bookie -> ``DataUnknownError``; otherwise the last transport or
status error.
"""

from __future__ import annotations

import asyncio

from client.config import ClientConfig
from client.connection import status_error
from client.digest import Digester
from client.entry import Entry
from client.pool import BookiePool
from client.quorum import write_set
from metadata import LedgerMetadata
from protocol import (
    EntryBody,
    MalformedEntryError,
    ReadRequest,
    ReadResponse,
    StatusCode,
    parse_entry,
)
from protocol.errors import (
    BKError,
    DataUnknownError,
    DigestMismatchError,
    NoSuchEntryError,
)


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


class EntryReader:
    def __init__(
        self, ledger_id: int, digest: Digester, pool: BookiePool, config: ClientConfig
    ) -> None:
        self.ledger_id = ledger_id
        self._digest = digest
        self._pool = pool
        self._config = config

    async def fetch(self, metadata: LedgerMetadata, entry_id: int) -> EntryBody:
        """The entry's verified body from the first bookie of its write set with a good copy.

        Bookies are asked in write-set order; one that has not answered after
        ``speculative_read_timeout`` keeps its request but the next one is asked as well, so a
        silent bookie costs a short delay rather than a full read timeout."""
        fragment = metadata.fragment_for(entry_id)
        slots = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
        bookies = [fragment.ensemble[s] for s in slots]
        errors: list[BKError] = []
        running: set[asyncio.Task[EntryBody]] = set()
        try:
            for index in range(len(bookies) + 1):
                if index < len(bookies):
                    running.add(asyncio.ensure_future(self._ask(bookies[index], entry_id)))
                    wait = self._config.speculative_read_timeout
                else:
                    wait = None  # everyone has been asked: wait for the rest
                while running:
                    done, running = await asyncio.wait(
                        running, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                    )
                    if not done:
                        break  # speculative timeout: ask the next bookie too
                    for task in done:
                        error = task.exception()
                        if error is None:
                            return task.result()
                        assert isinstance(error, BKError)
                        errors.append(error)
                    if index < len(bookies):
                        break  # a failure: move on to the next bookie at once
            raise summarize(self.ledger_id, entry_id, errors)
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _ask(self, bookie: str, entry_id: int) -> EntryBody:
        conn = await self._pool.get(bookie)
        response = await conn.send(
            ReadRequest(conn.next_txn_id(), self.ledger_id, entry_id), self._config.read_timeout
        )
        assert isinstance(response, ReadResponse)
        if response.status is not StatusCode.EOK or response.body is None:
            raise status_error(response, bookie)
        try:
            parsed = parse_entry(response.body)
            self._digest.verify(parsed, self.ledger_id, entry_id)
        except (MalformedEntryError, DigestMismatchError) as exc:
            raise DigestMismatchError(f"bookie {bookie}: {exc}") from None
        return parsed

    async def read_one(self, metadata: LedgerMetadata, entry_id: int) -> Entry:
        body = await self.fetch(metadata, entry_id)
        return Entry(self.ledger_id, entry_id, body.payload)

    async def read_range(self, metadata: LedgerMetadata, first: int, last: int) -> list[Entry]:
        """Entries first..last inclusive, fetched with bounded parallelism, in order."""
        limit = asyncio.Semaphore(self._config.read_concurrency)

        async def one(entry_id: int) -> Entry:
            async with limit:
                return await self.read_one(metadata, entry_id)

        return list(await asyncio.gather(*(one(e) for e in range(first, last + 1))))
