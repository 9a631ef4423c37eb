"""READ_RANGE (protocol 3): consecutive entries of one ledger in one answer, for bulk copies.

After BookKeeper's batch read: an offloader copying a closed ledger asks once per run of
entries instead of once per entry. The rules are a plain READ's, applied to the run's first
entry, and the run ends where a READ of the next entry would not answer with a body:

- a ledger this bookie does not hold is ENOLEDGER; a first entry not stored here is ENOENTRY,
  or EUNKNOWN in a ledger in limbo (BP-46: it may have lost the entry); a damaged or unreadable
  first entry is EIO, never served (I10);
- otherwise the answer is EOK with the run: entries from the first, consecutive, ending before
  the first one not stored here or damaged, and bounded by the request's ``max_bytes`` (the
  first entry always sent), by ``MAX_RANGE_BYTES`` and by ``MAX_RANGE_ENTRIES``. The reader
  asks again from where the run ends, and an entry that ended it answers as a READ would;
- no fencing and no long poll: a copier reads closed ledgers, and a reader of an open one asks
  only for entries below its LAC.

Fetching the run holds one read turn (``ServerConnection.reading``), as one READ's fetch does:
a peer that pipelines range reads and never reads its answers makes the bookie hold at most its
few turns' runs, each within the caps above. Each entry answered counts as a read
(``BookieStats.reads``), each request in ``range_reads``; the whole request is timed as one
``read_entry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiobk.bookie.entrylog.format import CorruptEntryError
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.bookie.ops.read import missing_status
from aiobk.protocol import (
    MAX_BATCH_ENTRIES,
    ReadRangeRequest,
    ReadRangeResponse,
    StatusCode,
    pack_bodies,
)

if TYPE_CHECKING:
    from aiobk.bookie.context import BookieContext, Replier
    from aiobk.bookie.ledger_state import LedgerState

# The largest run one answer carries: its bodies' bytes (beyond the first entry, which is sent
# whatever its size, as a READ would send it) and its entries (an ADD_BATCH's bound).
MAX_RANGE_BYTES: Final = 4 * 1024 * 1024
MAX_RANGE_ENTRIES: Final = MAX_BATCH_ENTRIES


def handle_read_range(ctx: BookieContext, request: ReadRangeRequest, conn: Replier) -> None:
    stats = ctx.stats
    stats.range_reads += 1
    started = stats.clock()
    state = ctx.ledgers.get(request.ledger_id)
    if state is None:
        _reply(ctx, conn, _answer(request, None, StatusCode.ENOLEDGER), started)
    elif state.location(request.first_entry_id) < 0:
        stats.read_misses += 1
        _reply(ctx, conn, _answer(request, state, missing_status(state)), started)
    else:
        conn.spawn(_fetch_run(ctx, request, conn, state, started))


async def _fetch_run(
    ctx: BookieContext,
    request: ReadRangeRequest,
    conn: Replier,
    state: LedgerState,
    started: float,
) -> None:
    first = request.first_entry_id
    last = min(request.last_entry_id, first + MAX_RANGE_ENTRIES - 1)
    max_bytes = min(request.max_bytes, MAX_RANGE_BYTES)
    async with conn.reading():  # bounded: see the module docstring
        try:
            bodies = await ctx.storage.read_entries(state, first, last, max_bytes)
        except (CorruptEntryError, IndexCorruptError, OSError) as exc:
            ctx.log_corruption(exc)
            _reply(ctx, conn, _answer(request, state, StatusCode.EIO), started)
            return
        if not bodies:  # removed meanwhile (a deleted ledger, a compaction race lost)
            ctx.stats.read_misses += 1
            _reply(ctx, conn, _answer(request, state, missing_status(state)), started)
            return
        ctx.stats.reads += len(bodies)
        _reply(ctx, conn, _answer(request, state, StatusCode.EOK, pack_bodies(bodies)), started)


def _answer(
    request: ReadRangeRequest,
    state: LedgerState | None,
    status: StatusCode,
    bodies: bytes = b"",
) -> ReadRangeResponse:
    lac = state.lac if state is not None else -1
    return ReadRangeResponse(
        request.txn_id, status, request.ledger_id, request.first_entry_id, lac, bodies
    )


def _reply(ctx: BookieContext, conn: Replier, response: ReadRangeResponse, started: float) -> None:
    conn.reply(response)
    stats = ctx.stats
    stats.histograms.read_entry.record(stats.clock() - started)
