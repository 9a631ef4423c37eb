"""Finding a time in a log of envelope records: the first record stamped at or after it.

A binary search, never a scan: first over the log's ledgers (is the last record of this one
stamped at or after the time?), then over the entries of the ledger found. It reads one
ledger's metadata and one entry per step, so a log of L ledgers of N records costs about
log2(L) metadata reads and log2(L) + log2(N) entry reads.

The search assumes the stamps do not decrease along the log, which holds when the writers
stamp with their clocks (the default) and those clocks do not step back. Where a writer gave
stamps out of order, the position found is still a record at or after the time whose
predecessor in its ledger is before it, not necessarily the first such record of the log (as
with any time index built on that assumption). Empty ledgers, and ledgers truncated away
meanwhile, are stepped over.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiobk.client.log.format import ENVELOPE, timestamp_of
from aiobk.client.log.ledger_client import LedgerClient
from aiobk.client.log.position import LogPosition
from aiobk.client.read_handle import ReadHandle
from aiobk.protocol.errors import NoSuchLedgerError


@dataclass
class _Ledger:
    handle: ReadHandle
    last: int  # its last readable entry (>= 0)
    last_stamp: int


class _Search:
    def __init__(self, bk: LedgerClient, ledgers: tuple[int, ...], password: bytes) -> None:
        self.bk = bk
        self.ledgers = ledgers
        self.password = password
        self.opened: dict[int, _Ledger | None] = {}
        self.reads = 0  # entries read (the tests hold the search to its bound)

    async def stamp(self, handle: ReadHandle, entry_id: int) -> int:
        self.reads += 1
        (entry,) = await handle.read_unconfirmed(entry_id, entry_id)
        return timestamp_of(entry.data)

    async def ledger(self, index: int) -> _Ledger | None:
        """The ledger at ``index`` of the log with its last record's stamp; None if empty."""
        ledger_id = self.ledgers[index]
        if ledger_id not in self.opened:
            found: _Ledger | None = None
            try:
                handle = await self.bk.open_ledger(ledger_id, self.password, recovery=False)
                last = handle.last_add_confirmed
                if last >= 0:
                    found = _Ledger(handle, last, await self.stamp(handle, last))
            except NoSuchLedgerError:
                pass  # truncated away: as good as empty
            self.opened[ledger_id] = found
        return self.opened[ledger_id]

    async def first_nonempty(self, start: int, end: int) -> int | None:
        for index in range(start, end):
            if await self.ledger(index) is not None:
                return index
        return None


async def position_at_time(
    bk: LedgerClient,
    name: str,
    timestamp: int,
    password: bytes = b"",
    *,
    stats: dict[str, int] | None = None,
) -> LogPosition | None:
    """The position of the first record of log ``name`` stamped at or after ``timestamp`` (ms
    since the epoch); None when every record is older. ValueError for a log of raw records
    (they carry no time). See the module docstring for the cost and the assumption."""
    record = await bk.store.read_log(name)
    if record.record_format != ENVELOPE:
        raise ValueError(
            f"log {name!r} holds {record.record_format} records, which carry no timestamp"
        )
    search = _Search(bk, record.ledgers, password)
    try:
        return await _search(search, timestamp, stats)
    finally:
        for opened in search.opened.values():
            if opened is not None:
                await opened.handle.close()


async def _search(
    search: _Search, timestamp: int, stats: dict[str, int] | None
) -> LogPosition | None:
    ledgers = search.ledgers
    lo, hi = 0, len(ledgers)
    # The first ledger whose last record is stamped at or after the time (an empty ledger
    # answers as the next non-empty one does: the predicate stays monotone).
    while lo < hi:
        mid = (lo + hi) // 2
        index = await search.first_nonempty(mid, hi)
        if index is None:
            hi = mid
            continue
        found = await search.ledger(index)
        assert found is not None
        if found.last_stamp >= timestamp:
            hi = mid
        else:
            lo = index + 1
    index = await search.first_nonempty(lo, len(ledgers))
    if stats is not None:
        stats["reads"] = search.reads
    if index is None:
        return None
    ledger = search.opened[ledgers[index]]
    assert ledger is not None
    first, last = 0, ledger.last  # the last one qualifies; find the first that does
    while first < last:
        mid = (first + last) // 2
        if await search.stamp(ledger.handle, mid) >= timestamp:
            last = mid
        else:
            first = mid + 1
    if stats is not None:
        stats["reads"] = search.reads
    return LogPosition(ledgers[index], first)


__all__ = ["position_at_time"]
