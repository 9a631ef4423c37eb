"""ADD_BATCH (protocol 2): the adds of one ledger in one frame, one answer for all.

Each entry goes through the add path exactly as the ADD of that entry would -- every check,
the journal, the reply once durable -- in the batch's order (its header, read once when the
batch unpacks, is checked there as ``handle_add`` checks it), so a batch changes what a request
costs (one frame, one decode, one answer) and nothing of what an add means. The answer waits
for the last entry's; until then the batch is one request in flight on its connection.
A batch that does not unpack (``protocol.batch``: entries of this ledger, ids increasing, at
most ``MAX_BATCH_ENTRIES``) is refused whole with EBADREQ and nothing of it is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from aiobk.bookie import record_codecs
from aiobk.bookie.flow import ADD_HELD_BYTES
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.bookie.ops.add import add_entry
from aiobk.protocol import (
    AddBatchRequest,
    AddBatchResponse,
    AddFlag,
    AddRequest,
    AddResponse,
    BatchError,
    Durability,
    Response,
    StatusCode,
    pack_statuses,
)

if TYPE_CHECKING:
    from aiobk.bookie.context import BookieContext, Poll, Replier

log = logging.getLogger(__name__)


def handle_add_batch(ctx: BookieContext, request: AddBatchRequest, conn: Replier) -> int:
    """Returns the entries handled: each counts as a request against the connection's turn
    (``bookie.flow.FRAMES_PER_TURN``), so a peer's batches hold the loop no longer than as many
    single adds would."""
    txn_id, ledger_id = request.txn_id, request.ledger_id
    ctx.stats.add_batches += 1
    try:
        entries = record_codecs.unpack_bodies(request.bodies, ledger_id)
    except BatchError:
        ctx.stats.bad_requests += 1
        conn.reply(AddBatchResponse(txn_id, StatusCode.EBADREQ, ledger_id))
        return 1
    stats = ctx.stats
    stats.adds += len(entries)
    started = stats.clock()  # when handled
    if _add_new(ctx, request, conn, entries, started):
        return len(entries)
    batch = _Batch(conn, txn_id, ledger_id, [entry_id for entry_id, _lac, _body in entries])
    make = AddRequest.from_fields
    flags, durability, key = request.flags, request.durability, request.master_key
    for entry_id, lac, body in entries:
        add = make(txn_id, ledger_id, entry_id, flags, durability, key, body)
        try:
            add_entry(ctx, add, batch, lac, started)
        except IndexCorruptError as exc:  # as the connection answers a single ADD's: EIO
            ctx.stats.corrupt_reads += 1
            log.error("bookie %s: %s", ctx.admin.bookie_id, exc)
            batch.reply(AddResponse(txn_id, StatusCode.EIO, ledger_id, entry_id))
    return len(entries)


def _add_new(
    ctx: BookieContext,
    request: AddBatchRequest,
    conn: Replier,
    entries: list[tuple[int, int, bytes]],
    started: float,
) -> bool:
    """The common batch -- a writer's next entries, of a ledger in use here, that every check
    of ``add_entry`` passes -- stored and journaled as one: the checks made once, one journal
    callback and one answer (``Ledgers.add_batch``). False, having done nothing, for any
    other batch: its entries then go through ``add_entry`` one by one."""
    ledger_id = request.ledger_id
    state = ctx.ledgers.in_use(ledger_id)
    if (
        state is None
        or not ctx.write_state.writable
        or not state.master_key
        or state.master_key != request.master_key
        or (state.fenced and not request.flags & AddFlag.RECOVERY_ADD)
        or entries[0][0] <= state.max_entry  # ids increase: every entry is new here
    ):
        return False
    txn_id, count = request.txn_id, len(entries)
    pairs = [(entry_id, body) for entry_id, _lac, body in entries]
    size = sum(len(body) for _entry_id, body in pairs)
    ctx.stats.add_bytes += size
    flow = ctx.flow
    held = size + count * ADD_HELD_BYTES  # as ``add_entry`` holds for each
    flow.add_started(held)
    cursor = state.sync
    answered = False

    def reply(error: BaseException | None) -> None:
        # Runs twice for a volatile batch (written, then synced): only the first answers.
        nonlocal answered
        if not answered:
            answered = True
            flow.add_done(held)
            statuses = b"" if error is None else pack_statuses([StatusCode.EIO] * count)
            conn.reply(
                AddBatchResponse.from_fields(
                    txn_id, StatusCode.EOK, ledger_id, cursor.last_add_synced, statuses
                )
            )
            figures = flow.stats
            figures.histograms.add_entry_request.record(figures.clock() - started, count)

    volatile = reply if request.durability is Durability.VOLATILE else None
    lac = max(lac for _entry_id, lac, _body in entries)
    ctx.ledgers.add_batch(state, pairs, lac, reply, volatile)
    return True


class _Batch:
    """The ``Replier`` each entry of a batch answers to: collects their statuses and answers
    the batch on its connection when the last one is in. Everything else is the connection's."""

    __slots__ = ("_conn", "_ledger_id", "_left", "_statuses", "_synced", "_txn_id")

    def __init__(self, conn: Replier, txn_id: int, ledger_id: int, entry_ids: list[int]) -> None:
        self._conn = conn
        self._txn_id = txn_id
        self._ledger_id = ledger_id
        self._left = len(entry_ids)
        # entry id -> status, in the batch's order (ids are distinct: protocol.batch)
        self._statuses: dict[int, StatusCode] = dict.fromkeys(entry_ids, StatusCode.EOK)
        self._synced = -1

    def reply(self, response: Response) -> None:
        entry_id = getattr(response, "entry_id", None)
        if entry_id in self._statuses:
            self._statuses[entry_id] = response.status
        self._synced = max(self._synced, getattr(response, "last_add_synced", -1))
        self._left -= 1
        if self._left == 0:
            self._conn.reply(
                AddBatchResponse.from_fields(
                    self._txn_id,
                    StatusCode.EOK,
                    self._ledger_id,
                    self._synced,
                    pack_statuses(list(self._statuses.values())),
                )
            )

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def roles(self) -> frozenset[str]:
        return self._conn.roles

    @property
    def origin(self) -> object:
        return self._conn.origin

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._conn.spawn(coro)

    def reading(self) -> AbstractAsyncContextManager[None]:  # pragma: no cover - adds never read
        return self._conn.reading()

    @property
    def long_polls(self) -> int:  # pragma: no cover - adds never poll
        return self._conn.long_polls

    def poll_started(self, poll: Poll) -> None:  # pragma: no cover - adds never poll
        self._conn.poll_started(poll)

    def poll_ended(self, poll: Poll) -> None:  # pragma: no cover - adds never poll
        self._conn.poll_ended(poll)
