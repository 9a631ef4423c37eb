"""ADD: store an entry and acknowledge it once durable (BookKeeper's WriteEntryProcessor).

Checks, in order: ids sane and matching the body header; writable; master key (a ledger this
bookie does not hold yet is created by its first add only once ``bookie.key_check`` has found
it in the metadata with that key's digest, so nobody can squat a ledger id before its creator,
and its key is journaled before the add; a mismatch is EUA); fence (a fenced ledger refuses
normal adds with EFENCED but takes RECOVERY_ADD: BookKeeper's "Fencing" page); an entry already
held (below). The entry goes to ledger storage at once, so reads see it, and to the journal;
the reply waits for the journal's fdatasync ("The BookKeeper protocol": "Bookie acknowledges a
write once it has been durably persisted").

An entry already held is never replaced (a RECOVERY_ADD carrying the public key of the empty
password once overwrote entry 0 of a closed ledger, and readers served it -- CRC32C is no MAC).
A writer never writes an entry id twice ("The BookKeeper protocol", "Writing to ledgers": ids
are dense and each entry has one value), recovery writes back what it read (the "Fencing" page,
"Fencing internals", step 3), and autorecovery and BP-46's repair copy what peers hold: none of
them can mean different bytes. So an add of an entry held is acknowledged, without a write, once
what the journal holds is synced, if it is the same entry -- ledger, entry id, digest type,
length and payload; the piggybacked LAC and so the digest may differ, as recovery's write-back
carries the LAC frozen at its start (docs/design/fencing-and-recovery.md) -- and refused with
EBADREQ if not (counted, logged once). EBADREQ, not EUA: a writer whose next entry id someone
with its key wrote first changes its ensemble (the client fails a ledger on EUA) and carries on.

``add_entry_request`` (BookKeeper's ADD_ENTRY_REQUEST) times each add that gets as far as the
journal, from its handling -- the loop turn that read it -- to its answer being queued: the
group-commit wait and the fdatasync, or the write alone for a volatile add.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiobk.bookie.entrylog.format import CorruptEntryError
from aiobk.bookie.flow import ADD_HELD_BYTES
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.protocol import (
    ENTRY_HEADER,
    HEADER_SIZE,
    AddFlag,
    AddRequest,
    AddResponse,
    DigestType,
    Durability,
    MalformedEntryError,
    StatusCode,
    peek_header,
)

if TYPE_CHECKING:
    from aiobk.bookie.context import BookieContext, Replier
    from aiobk.bookie.ledger_state import LedgerState

log = logging.getLogger(__name__)


def handle_add(ctx: BookieContext, request: AddRequest, conn: Replier) -> None:
    txn_id, ledger_id, entry_id = request.txn_id, request.ledger_id, request.entry_id
    stats = ctx.stats
    stats.adds += 1
    started = stats.clock()  # when handled
    try:
        body_ledger, body_entry, piggybacked_lac = peek_header(request.body)
    except MalformedEntryError:
        conn.reply(AddResponse(txn_id, StatusCode.EBADREQ, ledger_id, entry_id))
        return
    if body_ledger != ledger_id or body_entry != entry_id:
        conn.reply(AddResponse(txn_id, StatusCode.EBADREQ, ledger_id, entry_id))
        return
    add_entry(ctx, request, conn, piggybacked_lac, started)


def add_entry(
    ctx: BookieContext, request: AddRequest, conn: Replier, piggybacked_lac: int, started: float
) -> None:
    """An add whose body header was checked (``peek_header``: it names this ledger and entry)
    and counted, handled at ``started``: the checks from the writable state on, then storage
    and the journal. ADD_BATCH's entries come in here, their headers read once unpacking."""
    txn_id, ledger_id, entry_id = request.txn_id, request.ledger_id, request.entry_id
    stats = ctx.stats
    write_state = ctx.write_state
    if not write_state.writable and not (
        request.flags & AddFlag.RECOVERY_ADD and write_state.high_priority
    ):
        # Read-only (bookie.write_state): the writer changes its ensemble; recovery's adds
        # still land while there is room for them.
        stats.adds_refused_read_only += 1
        conn.reply(AddResponse(txn_id, StatusCode.EREADONLY, ledger_id, entry_id))
        return
    ledgers = ctx.ledgers
    state = ledgers.in_use(ledger_id)
    if state is None:
        if ctx.keys.looking_up(ledger_id):
            # A new ledger's first adds come while its metadata is read: they queue behind that
            # lookup, where they would go anyway, without asking the index for its state one by
            # one (a miss there costs more the more the bookie holds).
            _admit(ctx, request, conn, piggybacked_lac, started)
            return
        state = ledgers.get(ledger_id)
    if state is None or not state.master_key:
        # Not held here yet (or held without its key, BP-46): the metadata decides first.
        _admit(ctx, request, conn, piggybacked_lac, started)
        return
    if state.master_key != request.master_key:
        stats.auth_failures += 1
        conn.reply(AddResponse(txn_id, StatusCode.EUA, ledger_id, entry_id))
        return
    _store(ctx, request, conn, state, piggybacked_lac, started)


def _admit(
    ctx: BookieContext, request: AddRequest, conn: Replier, piggybacked_lac: int, started: float
) -> None:
    """The add of a ledger this bookie does not hold: once ``KeyCheck`` admits its key, the
    state is created (its key journaled) and the add goes on; else the refusal. While it
    waits, its bytes count as an add in progress (``bookie.flow``), as they are held."""
    held = len(request.body) + ADD_HELD_BYTES
    flow = ctx.flow
    flow.add_started(held)

    def admitted(status: StatusCode) -> None:
        flow.add_done(held)
        if status is StatusCode.EOK:
            state, status = ctx.ledgers.ensure(request.ledger_id, request.master_key)
            if state is not None:
                _store(ctx, request, conn, state, piggybacked_lac, started)
                return
        conn.reply(AddResponse(request.txn_id, status, request.ledger_id, request.entry_id))

    ctx.keys.admit(ctx, request.ledger_id, request.master_key, conn.origin, conn.roles, admitted)


def _store(
    ctx: BookieContext,
    request: AddRequest,
    conn: Replier,
    state: LedgerState,
    piggybacked_lac: int,
    when: float,
) -> None:
    txn_id, ledger_id, entry_id = request.txn_id, request.ledger_id, request.entry_id
    if state.fenced and not request.flags & AddFlag.RECOVERY_ADD:
        conn.reply(AddResponse(txn_id, StatusCode.EFENCED, ledger_id, entry_id))
        return
    if entry_id <= state.max_entry:  # appends come in order: only a rare add looks further
        location = state.location(entry_id)
        if location >= 0:
            conn.spawn(_already_held(ctx, request, conn, state, location))
            return
    body = request.body
    size = len(body)
    ctx.stats.add_bytes += size
    flow = ctx.flow
    held = size + ADD_HELD_BYTES  # its body and the objects it holds until answered
    flow.add_started(held)  # until answered: bounds what the journal queue holds
    cursor = state.sync
    started: float | None = when  # None once answered

    def reply(error: BaseException | None) -> None:
        # Runs twice for a volatile add (written, then synced): only the first answers.
        # It captures no more names than before it was timed: each is one more object alive
        # per add in flight, paid for in garbage collection passes (one more, ``stats``, made
        # 15% more of them and cost about 3% of the CPU per add, measured in process). So the
        # start time is the answered flag too, and the figures are reached through ``flow``.
        nonlocal started
        if started is not None:
            flow.add_done(held)
            status = StatusCode.EIO if error is not None else StatusCode.EOK
            conn.reply(
                AddResponse.from_fields(txn_id, status, ledger_id, entry_id, cursor.last_add_synced)
            )
            figures = flow.stats
            figures.histograms.add_entry_request.record(figures.clock() - started)
            started = None

    # PERSISTENT: answer after the fdatasync. VOLATILE (BP-14): answer once written.
    volatile = reply if request.durability is Durability.VOLATILE else None
    ctx.ledgers.add(state, entry_id, body, piggybacked_lac, reply, volatile)


async def _already_held(
    ctx: BookieContext, request: AddRequest, conn: Replier, state: LedgerState, location: int
) -> None:
    """An add of an entry this bookie holds (module docstring): the same entry is acknowledged
    once the journal has synced what it holds (the first copy may still be on its way to the
    disk); different bytes are refused, and the copy held stays."""
    txn_id, ledger_id, entry_id = request.txn_id, request.ledger_id, request.entry_id
    try:
        held = await ctx.storage.read_entry(state, entry_id, location)
    except (CorruptEntryError, IndexCorruptError, OSError) as exc:
        # The copy held cannot be read: it is not replaced on an unverifiable say-so either.
        ctx.log_corruption(exc)
        conn.reply(AddResponse(txn_id, StatusCode.EIO, ledger_id, entry_id))
        return
    if held is None or not same_entry(held, request.body):
        figures = ctx.keys.stats
        figures.rewrites_refused += 1
        if figures.rewrites_refused == 1:
            log.warning(
                "bookie %s: an add (flags %s) of entry %d/%d with bytes unlike the copy held "
                "was refused; further ones are counted (key_check_rewrites_refused)",
                ctx.admin.bookie_id, int(request.flags), ledger_id, entry_id,
            )  # fmt: skip
        conn.reply(AddResponse(txn_id, StatusCode.EBADREQ, ledger_id, entry_id))
        return
    cursor = state.sync

    def synced(error: BaseException | None) -> None:
        status = StatusCode.EIO if error is not None else StatusCode.EOK
        conn.reply(AddResponse(txn_id, status, ledger_id, entry_id, cursor.last_add_synced))

    ctx.journal.barrier(synced)


def same_entry(held: bytes, offered: bytes) -> bool:
    """Whether two entry bodies are the same entry: ledger, entry id, digest type, length and
    payload equal. The piggybacked LAC, and the digest that covers it, may differ (a recovery
    write-back carries the LAC frozen at its start). Bodies that do not parse are unequal
    unless identical."""
    if held == offered:
        return True
    try:
        peek_header(held)
        peek_header(offered)
    except MalformedEntryError:
        return False
    _v1, kind1, ledger1, entry1, _lac1, length1 = ENTRY_HEADER.unpack_from(held)
    _v2, kind2, ledger2, entry2, _lac2, length2 = ENTRY_HEADER.unpack_from(offered)
    if (kind1, ledger1, entry1, length1) != (kind2, ledger2, entry2, length2):
        return False
    start = HEADER_SIZE + DigestType(kind1).size
    return held[start:] == offered[start:]
