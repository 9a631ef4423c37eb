"""ADD: store an entry and acknowledge it once durable (BookKeeper's WriteEntryProcessor).

Checks, in order: ids sane and matching the body header; master key (a new ledger takes the
key of its first add, journaled before the add; a mismatch is EUA); fence (a fenced ledger
refuses normal adds with EFENCED but takes RECOVERY_ADD, fencing.md). The entry goes to ledger
storage at once, so reads see it, and to the journal; the reply waits for the journal's
fdatasync (protocol.md: "Bookie acknowledges a write once it has been durably persisted").

``add_entry_request`` (BookKeeper's ADD_ENTRY_REQUEST) times each add that gets as far as the
journal, from its handling -- the loop turn that read it -- to its answer being queued: the
group-commit wait and the fdatasync, or the write alone for a volatile add.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiobk.protocol import (
    AddFlag,
    AddRequest,
    AddResponse,
    Durability,
    MalformedEntryError,
    StatusCode,
    peek_header,
)

if TYPE_CHECKING:
    from aiobk.bookie.context import BookieContext, Replier


def handle_add(ctx: BookieContext, request: AddRequest, conn: Replier) -> None:
    txn_id, ledger_id, entry_id = request.txn_id, request.ledger_id, request.entry_id
    stats = ctx.stats
    stats.adds += 1
    started: float | None = stats.clock()  # when handled; None once answered

    def fail(status: StatusCode) -> None:
        conn.reply(AddResponse(txn_id, status, ledger_id, entry_id))

    body = request.body
    try:
        body_ledger, body_entry, piggybacked_lac = peek_header(body)
    except MalformedEntryError:
        fail(StatusCode.EBADREQ)
        return
    if body_ledger != ledger_id or body_entry != entry_id:
        fail(StatusCode.EBADREQ)
        return
    write_state = ctx.write_state
    if not write_state.writable and not (
        request.flags & AddFlag.RECOVERY_ADD and write_state.high_priority
    ):
        # Read-only (bookie.write_state): the writer changes its ensemble; recovery's adds
        # still land while there is room for them.
        stats.adds_refused_read_only += 1
        fail(StatusCode.EREADONLY)
        return
    ledgers = ctx.ledgers
    state, status = ledgers.ensure(ledger_id, request.master_key)
    if state is None:
        fail(status)
        return
    if state.fenced and not request.flags & AddFlag.RECOVERY_ADD:
        fail(StatusCode.EFENCED)
        return
    size = len(body)
    stats.add_bytes += size
    flow = ctx.flow
    flow.add_started(size)  # until answered: bounds what the journal queue holds
    cursor = state.sync

    def reply(error: BaseException | None) -> None:
        # Runs twice for a volatile add (written, then synced): only the first answers.
        # It captures no more names than before it was timed: each is one more object alive
        # per add in flight, paid for in garbage collection passes (one more, ``stats``, made
        # 15% more of them and cost about 3% of the CPU per add, measured in process). So the
        # start time is the answered flag too, and the figures are reached through ``flow``.
        nonlocal started
        if started is not None:
            flow.add_done(size)
            status = StatusCode.EIO if error is not None else StatusCode.EOK
            conn.reply(AddResponse(txn_id, status, ledger_id, entry_id, cursor.last_add_synced))
            figures = flow.stats
            figures.histograms.add_entry_request.record(figures.clock() - started)
            started = None

    # PERSISTENT: answer after the fdatasync. VOLATILE (BP-14): answer once written.
    volatile = reply if request.durability is Durability.VOLATILE else None
    ledgers.add(state, entry_id, body, piggybacked_lac, reply, volatile)
