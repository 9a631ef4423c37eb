"""ADD: store an entry and acknowledge it once durable (BookKeeper's WriteEntryProcessor).

Checks, in order: ids sane and matching the body header; master key (a new ledger takes the
key of its first add, journaled before the add; a mismatch is EUA); fence (a fenced ledger
refuses normal adds with EFENCED but takes RECOVERY_ADD, fencing.md). The entry goes to ledger
storage at once, so reads see it, and to the journal; the reply waits for the journal's
fdatasync (protocol.md: "Bookie acknowledges a write once it has been durably persisted").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiobk.bookie.journal_format import LEDGER_PREFIX, RecordType, add_payload
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
    from aiobk.bookie.connection import ServerConnection
    from aiobk.bookie.ledger import LedgerState
    from aiobk.bookie.server import Bookie


def _key_durable(state: LedgerState, error: BaseException | None) -> None:
    if error is None:
        state.key_pending = False


def ensure_ledger(
    bookie: Bookie, ledger_id: int, master_key: bytes
) -> tuple[LedgerState | None, StatusCode]:
    """The ledger's state, created (key journaled) if new; EUA on a key mismatch, ENOLEDGER for
    a ledger garbage collection dropped."""
    state = bookie.storage.ledgers.get(ledger_id)
    if state is None:
        if ledger_id in bookie.storage.deleted:
            return None, StatusCode.ENOLEDGER  # garbage collected: it must not come back
        if not master_key:
            return None, StatusCode.EBADREQ
        state = bookie.storage.create(ledger_id, master_key)
        state.key_pending = True
        bookie.journal.append(
            RecordType.MASTER_KEY,
            LEDGER_PREFIX.pack(ledger_id) + master_key,
            lambda error: _key_durable(state, error),
        )
        return state, StatusCode.EOK
    if not state.master_key and master_key:
        # Created at boot (BP-46 phase one) with its key unknown: the first writer or
        # recovery that fences or writes it brings the key.
        state.master_key = master_key
        state.key_pending = True
        bookie.journal.append(
            RecordType.MASTER_KEY,
            LEDGER_PREFIX.pack(ledger_id) + master_key,
            lambda error: _key_durable(state, error),
        )
        return state, StatusCode.EOK
    if state.master_key != master_key:
        bookie.stats.auth_failures += 1
        return None, StatusCode.EUA
    return state, StatusCode.EOK


def handle_add(bookie: Bookie, request: AddRequest, conn: ServerConnection) -> None:
    txn_id, ledger_id, entry_id = request.txn_id, request.ledger_id, request.entry_id
    stats = bookie.stats
    stats.adds += 1

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
    write_state = bookie.write_state
    if not write_state.writable and not (
        request.flags & AddFlag.RECOVERY_ADD and write_state.high_priority
    ):
        # Read-only (bookie.write_state): the writer changes its ensemble; recovery's adds
        # still land while there is room for them.
        stats.adds_refused_read_only += 1
        fail(StatusCode.EREADONLY)
        return
    state, status = ensure_ledger(bookie, ledger_id, request.master_key)
    if state is None:
        fail(status)
        return
    if state.fenced and not request.flags & AddFlag.RECOVERY_ADD:
        fail(StatusCode.EFENCED)
        return
    bookie.storage.add_entry(state, entry_id, body)
    size = len(body)
    stats.add_bytes += size
    flow = bookie.flow
    flow.add_started(size)  # until answered: bounds what the journal queue holds
    state.advance_lac(piggybacked_lac)
    cursor = state.sync
    cursor.confirmed(piggybacked_lac)  # BP-14: a LAC is confirmed on an ack quorum
    if not bookie.config.journal_write_data:
        # BP-46: the add skips the journal and is answered once in ledger storage (in memory
        # until the next flush: a crash loses it, which boot-time fencing and limbo cover).
        def stored(error: BaseException | None) -> None:
            flow.add_done(size)
            status = StatusCode.EIO if error is not None else StatusCode.EOK
            conn.reply(AddResponse(txn_id, status, ledger_id, entry_id, cursor.last_add_synced))

        if state.key_pending:  # a new ledger's master key must be durable before any ack
            bookie.journal.barrier(stored)
        else:
            stored(None)
        return
    answered = False

    def reply(error: BaseException | None) -> None:
        nonlocal answered
        if not answered:
            answered = True
            flow.add_done(size)
            status = StatusCode.EIO if error is not None else StatusCode.EOK
            conn.reply(AddResponse(txn_id, status, ledger_id, entry_id, cursor.last_add_synced))

    def synced(error: BaseException | None) -> None:
        if error is None:
            cursor.synced(entry_id)
        reply(error)

    # PERSISTENT: answer after the fdatasync. VOLATILE (BP-14): answer once written.
    volatile = reply if request.durability is Durability.VOLATILE else None
    bookie.journal.append(
        RecordType.ADD, add_payload(ledger_id, entry_id, body), synced, on_written=volatile
    )
