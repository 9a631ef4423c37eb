"""READ: an entry, the LAC (entry id -1), with fencing and long polling.

- FENCE (recovery's reads; BookKeeper's "Fencing" page, "Fencing internals"): the ledger is
  marked fenced at once and the answer waits until the fence is durable in the journal, so an
  acknowledged fence survives any crash. A fence for a ledger this bookie never saw creates
  it, fenced -- once ``bookie.key_check`` has found the ledger in the metadata with the key's
  digest (otherwise fencing ids not created yet squatted them). Every recovery read carries
  the flag (recovery reads must fence: docs/design/fencing-and-recovery.md), so each bookie
  that answers recovery has promised to refuse the old writer.
- LONG_POLL: answer once the bookie's LAC is above ``previous_lac`` or after ``timeout_ms``
  (capped), whichever is first; the waiter (``LongPoll``: no task) is removed either way. Over
  the long-poll caps (``bookie.flow``) the answer is ETOOMANYREQUESTS at once.
- Fetching an entry waits for a turn (``ServerConnection.reading``): a peer that does not read
  its answers cannot make the bookie hold one entry per request it pipelined.
- A missing entry is ENOENTRY, a missing ledger ENOLEDGER (explicit negatives) -- except in a
  ledger in limbo (BP-46), where a missing entry is EUNKNOWN; a stored entry that fails its
  checksum is EIO, never served.

Timed (``BookieStats.histograms``): ``read_entry`` (BookKeeper's READ_ENTRY), each read that is
not a long poll, fencing ones included, from its handling to its answer being queued;
``read_entry_long_poll_wait`` (READ_ENTRY_LONG_POLL_WAIT), how long each long poll that had to
wait waited, until its LAC moved or its time was up.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiobk.bookie.entrylog.format import CorruptEntryError
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.protocol import LAC_ENTRY_ID, ReadFlag, ReadRequest, ReadResponse, StatusCode

if TYPE_CHECKING:
    from aiobk.bookie.context import BookieContext, Replier
    from aiobk.bookie.ledger_state import LedgerState

# ReadFlag's bits tested with int's own ``&`` (an IntFlag's goes through the enum machinery).
_FENCE = int(ReadFlag.FENCE)
_LONG_POLL = int(ReadFlag.LONG_POLL)
_bits = int.__and__


class LongPoll:
    """One long poll waiting for its ledger's LAC to pass ``previous_lac``: an entry in the
    ledger's waiter set and a timer, no task (a task, its future and its frames cost about
    three times as much per poll). Registering, expiring and leaving are O(1). ``wake``
    answers it -- the LAC moved, the ledger was dropped, or its time is up; ``cancel`` forgets
    it (its connection went away)."""

    __slots__ = ("_conn", "_ctx", "_request", "_started", "_state", "_timer")

    def __init__(
        self,
        ctx: BookieContext,
        conn: Replier,
        request: ReadRequest,
        state: LedgerState,
        timeout: float,
    ) -> None:
        self._ctx = ctx
        self._conn = conn
        self._request = request
        self._state = state
        self._started = ctx.stats.clock()
        ctx.stats.long_polls += 1
        ctx.flow.long_polls += 1
        state.add_waiter(self)
        conn.poll_started(self)
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            timeout, self.wake
        )

    @property
    def previous_lac(self) -> int:
        return self._request.previous_lac

    def _leave(self) -> bool:
        if self._timer is None:
            return False
        self._timer.cancel()
        self._timer = None
        self._state.remove_waiter(self)
        self._ctx.flow.long_polls -= 1
        self._conn.poll_ended(self)
        return True

    def wake(self) -> None:
        if self._leave() and not self._conn.closed:
            stats = self._ctx.stats
            stats.histograms.read_entry_long_poll_wait.record(stats.clock() - self._started)
            _after_poll(self._ctx, self._request, self._conn, self._state)

    def cancel(self) -> None:
        self._leave()


def _long_poll(ctx: BookieContext, request: ReadRequest, conn: Replier, state: LedgerState) -> None:
    """Answer now if the LAC is already past ``previous_lac`` (or no wait was asked), else
    wait (``LongPoll``) -- unless the caps are reached: ETOOMANYREQUESTS at once."""
    timeout = min(request.timeout_ms / 1000, ctx.config.max_long_poll_timeout)
    if state.lac > request.previous_lac or timeout <= 0:
        _after_poll(ctx, request, conn, state)
    elif not ctx.flow.long_poll_room(conn.long_polls):
        ctx.stats.long_polls_refused += 1
        conn.reply(_answer(request, state, StatusCode.ETOOMANYREQUESTS))
    else:
        LongPoll(ctx, conn, request, state, timeout)


def _after_poll(
    ctx: BookieContext, request: ReadRequest, conn: Replier, state: LedgerState
) -> None:
    """A long poll's answer: the LAC, and the entry asked for if the LAC now covers it."""
    if request.entry_id == LAC_ENTRY_ID or request.entry_id > state.lac:
        conn.reply(_answer(request, state, StatusCode.EOK))
    else:
        conn.spawn(_fetch(ctx, request, conn, state))


def handle_read(ctx: BookieContext, request: ReadRequest, conn: Replier) -> None:
    stats = ctx.stats
    stats.reads += 1
    started = stats.clock()
    if _bits(request.flags, _FENCE):
        held = ctx.ledgers.get(request.ledger_id)
        if held is None or not held.master_key:
            _admit_fence(ctx, request, conn, started)
        else:
            conn.spawn(_fenced_read(ctx, request, conn, started))
        return
    state = ctx.ledgers.get(request.ledger_id)
    if state is None:
        _reply(ctx, conn, _answer(request, None, StatusCode.ENOLEDGER), started)
    elif _bits(request.flags, _LONG_POLL):
        _long_poll(ctx, request, conn, state)
    elif request.entry_id == LAC_ENTRY_ID:
        _reply(ctx, conn, _answer(request, state, StatusCode.EOK), started)
    else:
        location = state.location(request.entry_id)
        if location < 0:
            stats.read_misses += 1
            _reply(ctx, conn, _answer(request, state, missing_status(state)), started)
        else:
            conn.spawn(_fetch(ctx, request, conn, state, location, started))


def _reply(
    ctx: BookieContext, conn: Replier, response: ReadResponse, started: float | None
) -> None:
    """Answer; a read timed from ``started`` (None: a long poll's) goes into ``read_entry``."""
    conn.reply(response)
    if started is not None:
        stats = ctx.stats
        stats.histograms.read_entry.record(stats.clock() - started)


def missing_status(state: LedgerState) -> StatusCode:
    """BP-46: a ledger in limbo may have lost the entry, so it never says it does not exist."""
    return StatusCode.EUNKNOWN if state.limbo else StatusCode.ENOENTRY


def _answer(
    request: ReadRequest, state: LedgerState | None, status: StatusCode, body: bytes | None = None
) -> ReadResponse:
    lac = state.lac if state is not None else -1
    last = state.max_entry if state is not None else -1
    return ReadResponse(
        request.txn_id, status, request.ledger_id, request.entry_id, lac, last, body
    )


def _admit_fence(ctx: BookieContext, request: ReadRequest, conn: Replier, started: float) -> None:
    """A fence of a ledger this bookie does not hold (or holds without its key, BP-46): only
    once ``KeyCheck`` admits its key (``bookie.key_check``)."""

    def admitted(status: StatusCode) -> None:
        if status is StatusCode.EOK:
            conn.spawn(_fenced_read(ctx, request, conn, started))
        else:
            _reply(ctx, conn, _answer(request, None, status), started)

    ctx.keys.admit(
        ctx, request.ledger_id, request.master_key, conn, conn.roles, admitted, fence=True
    )


async def _fenced_read(
    ctx: BookieContext, request: ReadRequest, conn: Replier, started: float
) -> None:
    ledgers = ctx.ledgers
    state, status = ledgers.ensure(request.ledger_id, request.master_key)
    if state is None:
        _reply(ctx, conn, _answer(request, None, status), started)
        return
    if await ledgers.fence(state) is not None:
        _reply(ctx, conn, _answer(request, state, StatusCode.EIO), started)
    elif _bits(request.flags, _LONG_POLL):
        _long_poll(ctx, request, conn, state)
    elif request.entry_id == LAC_ENTRY_ID:
        _reply(ctx, conn, _answer(request, state, StatusCode.EOK), started)
    else:
        await _fetch(ctx, request, conn, state, None, started)


async def _fetch(
    ctx: BookieContext,
    request: ReadRequest,
    conn: Replier,
    state: LedgerState,
    location: int | None = None,
    started: float | None = None,
) -> None:
    """Read the entry's body from storage and answer with it (``location``: where the index
    said it was when the request came; see ``LedgerStorage.read_entry``; ``started``: when a
    timed read was handled)."""
    async with conn.reading():  # bounded: see ctx.flow
        try:
            body = await ctx.storage.read_entry(state, request.entry_id, location)
        except (CorruptEntryError, IndexCorruptError, OSError) as exc:
            # A damaged copy or a failing disk: EIO, never "no such entry" (I10), and always
            # an answer -- an unanswered read would only time out at the client.
            ctx.log_corruption(exc)
            _reply(ctx, conn, _answer(request, state, StatusCode.EIO), started)
            return
        if body is None:
            ctx.stats.read_misses += 1
            if _bits(request.flags, _LONG_POLL):
                _reply(ctx, conn, _answer(request, state, StatusCode.EOK), started)
            else:
                _reply(ctx, conn, _answer(request, state, missing_status(state)), started)
            return
        _reply(ctx, conn, _answer(request, state, StatusCode.EOK, body), started)
