"""Reading entries (the guide's "Reading from ledgers": a regular read needs one positive answer).

An entry is asked of the bookies of its write set (in its fragment) one after another: the
first good copy wins. A copy whose digest does not verify is skipped (``DigestMismatchError`` if
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
from protocol import MalformedEntryError, ReadRequest, ReadResponse, StatusCode, parse_entry
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

    async def read_one(self, metadata: LedgerMetadata, entry_id: int) -> Entry:
        fragment = metadata.fragment_for(entry_id)
        slots = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
        errors: list[BKError] = []
        for slot in slots:
            bookie = fragment.ensemble[slot]
            try:
                conn = await self._pool.get(bookie)
                response = await conn.send(
                    ReadRequest(conn.next_txn_id(), self.ledger_id, entry_id),
                    self._config.read_timeout,
                )
            except BKError as exc:
                errors.append(exc)
                continue
            assert isinstance(response, ReadResponse)
            if response.status is not StatusCode.EOK or response.body is None:
                errors.append(status_error(response, bookie))
                continue
            try:
                data = self._digest.verify(parse_entry(response.body), self.ledger_id, entry_id)
            except (MalformedEntryError, DigestMismatchError) as exc:
                errors.append(DigestMismatchError(f"bookie {bookie}: {exc}"))
                continue
            return Entry(self.ledger_id, entry_id, data)
        raise summarize(self.ledger_id, entry_id, errors)

    async def read_range(self, metadata: LedgerMetadata, first: int, last: int) -> list[Entry]:
        """Entries first..last inclusive, fetched with bounded parallelism, in order."""
        limit = asyncio.Semaphore(self._config.read_concurrency)

        async def one(entry_id: int) -> Entry:
            async with limit:
                return await self.read_one(metadata, entry_id)

        return list(await asyncio.gather(*(one(e) for e in range(first, last + 1))))
