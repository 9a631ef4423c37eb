"""Learning the LAC from bookies: the quorum LAC read and the long-poll LAC read (the guide's
"Reading from ledgers").

Quorum LAC read: READ_LAC to every bookie of the last fragment; done once the answers cover every
ack quorum (then the highest LAC seen is at least every LAC a writer could have piggybacked to an
ack quorum). A bookie that never saw the ledger answers ENOLEDGER, which counts as LAC -1. The
result is never below the last fragment's first entry - 1 (that fragment was created at
LAC + 1).

Long poll: READ with LONG_POLL to the write set of the next entry; the first answer above
``previous`` wins; when every one comes back without progress the LAC is unchanged.
"""

from __future__ import annotations

import asyncio

from aiobk.client.config import ClientConfig
from aiobk.client.pool import BookiePool
from aiobk.client.quorum import coverage_impossible, covered, write_set
from aiobk.metadata import LedgerMetadata
from aiobk.protocol import (
    LAC_ENTRY_ID,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    StatusCode,
)
from aiobk.protocol.errors import BKError, BookieUnavailableError


async def read_lac_quorum(
    ledger_id: int, metadata: LedgerMetadata, pool: BookiePool, config: ClientConfig
) -> int:
    fragment = metadata.last_fragment
    e, wq, aq = metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
    answered: set[int] = set()
    failed: set[int] = set()
    best = fragment.first_entry_id - 1
    done = asyncio.Event()

    async def ask(slot: int, bookie: str) -> None:
        nonlocal best
        try:
            conn = await pool.get(bookie)
            response = await conn.send(
                ReadLacRequest(conn.next_txn_id(), ledger_id), config.read_timeout
            )
        except BKError:
            failed.add(slot)
        else:
            assert isinstance(response, ReadLacResponse)
            if response.status is StatusCode.EOK:
                best = max(best, response.lac)
                answered.add(slot)
            elif response.status is StatusCode.ENOLEDGER:
                answered.add(slot)
            else:
                failed.add(slot)
        if covered(e, wq, aq, answered) or coverage_impossible(e, wq, aq, failed):
            done.set()
        if len(answered) + len(failed) == e:
            done.set()

    tasks = [asyncio.ensure_future(ask(s, b)) for s, b in enumerate(fragment.ensemble)]
    try:
        await done.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not covered(e, wq, aq, answered):
        raise BookieUnavailableError(
            f"ledger {ledger_id}: too few bookies answered a LAC read ({sorted(answered)} of {e})"
        )
    return best


async def long_poll_lac(
    ledger_id: int,
    metadata: LedgerMetadata,
    previous: int,
    timeout: float,
    pool: BookiePool,
    config: ClientConfig,
) -> int:
    """The LAC once it passes ``previous``, or ``previous`` after ``timeout`` seconds."""
    fragment = metadata.last_fragment
    slots = write_set(previous + 1, metadata.ensemble_size, metadata.write_quorum)
    loop = asyncio.get_running_loop()
    result: asyncio.Future[int] = loop.create_future()
    remaining = len(slots)

    async def ask(bookie: str) -> None:
        nonlocal remaining
        try:
            conn = await pool.get(bookie)
            request = ReadRequest(
                conn.next_txn_id(),
                ledger_id,
                LAC_ENTRY_ID,
                ReadFlag.LONG_POLL,
                b"",
                previous,
                int(timeout * 1000),
            )
            response = await conn.send(request, timeout + config.read_timeout)
            advanced = (
                isinstance(response, ReadResponse)
                and response.status is StatusCode.EOK
                and response.lac > previous
            )
            if advanced and not result.done():
                assert isinstance(response, ReadResponse)
                result.set_result(response.lac)
        except BKError:
            pass
        finally:
            remaining -= 1
            if remaining == 0 and not result.done():
                result.set_result(previous)

    tasks = [asyncio.ensure_future(ask(fragment.ensemble[s])) for s in slots]
    try:
        return await result
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
