"""Learning the LAC from bookies: the quorum LAC read and the long-poll LAC read
("A Guide to the BookKeeper Replication Protocol", "Reading from ledgers").

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
import logging
from collections.abc import Callable, Sequence

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
    WriteLacRequest,
)
from aiobk.protocol.errors import BKError, BookieUnavailableError
from aiobk.tasks import TaskKeeper, cancel_all

log = logging.getLogger(__name__)


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
        await cancel_all(tasks)
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
        await cancel_all(tasks)


# What the writer says when its explicit-LAC timer fires: (LAC, ensemble) to announce, or None
# when there is nothing to say (adds in flight again, or the ledger failed).
LacDue = Callable[[], tuple[int, Sequence[str]] | None]


class ExplicitLac:
    """A writer's explicit LAC (BookKeeper's ExplicitLac; the replication protocol guide,
    "Reading from ledgers").

    Every add carries the LAC at send time, so the bookies learn the LAC of entry N only with
    entry N + 1. When the writer goes idle (``arm``) with a LAC no add has carried yet
    (``sent`` is the highest that went out), then after ``explicit_lac_delay`` every bookie of
    the ensemble gets a WRITE_LAC, so a reader's long poll wakes for the last entry too. Best
    effort: a failed WRITE_LAC is only logged, the next add carries the LAC anyway."""

    def __init__(
        self, ledger_id: int, master_key: bytes, pool: BookiePool, config: ClientConfig, lac: int
    ) -> None:
        self.ledger_id = ledger_id
        self._key = master_key
        self._pool = pool
        self._config = config
        self.sent = lac  # the highest LAC the bookies were told (piggybacked or explicit)
        self._timer: asyncio.TimerHandle | None = None
        self._tasks = TaskKeeper()

    def arm(self, due: LacDue) -> None:
        delay = self._config.explicit_lac_delay
        if delay <= 0 or self._timer is not None:
            return
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire, due)

    def _fire(self, due: LacDue) -> None:
        self._timer = None
        what = due()
        if what is None or what[0] <= self.sent:
            return
        lac, ensemble = what
        self.sent = lac
        for bookie in dict.fromkeys(ensemble):
            self._tasks.spawn(self._write(bookie, lac))

    async def _write(self, bookie: str, lac: int) -> None:
        try:
            conn = await self._pool.get(bookie)
            request = WriteLacRequest(conn.next_txn_id(), self.ledger_id, self._key, lac)
            await conn.send(request, self._config.add_timeout)
        except BKError as exc:
            log.debug("ledger %d: explicit LAC to %s failed: %s", self.ledger_id, bookie, exc)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._tasks.cancel_and_wait(BKError)
