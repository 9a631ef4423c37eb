"""READ_LAC and WRITE_LAC: the bookie's last add confirmed, and a writer's explicit LAC.

An explicit LAC lets readers advance without a new add (BookKeeper's ExplicitLac); it is
journaled before the write is acknowledged and raises the LAC only upward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiobk.protocol import (
    ReadLacRequest,
    ReadLacResponse,
    StatusCode,
    WriteLacRequest,
    WriteLacResponse,
)

if TYPE_CHECKING:
    from aiobk.bookie.context import BookieContext, Replier


def handle_read_lac(ctx: BookieContext, request: ReadLacRequest, conn: Replier) -> None:
    state = ctx.ledgers.get(request.ledger_id)
    if state is None:
        conn.reply(ReadLacResponse(request.txn_id, StatusCode.ENOLEDGER, request.ledger_id))
        return
    conn.reply(
        ReadLacResponse(
            request.txn_id, StatusCode.EOK, request.ledger_id, state.lac, state.max_entry
        )
    )


def handle_write_lac(ctx: BookieContext, request: WriteLacRequest, conn: Replier) -> None:
    txn_id, ledger_id = request.txn_id, request.ledger_id
    ledgers = ctx.ledgers
    state = ledgers.get(ledger_id)
    if state is None:
        conn.reply(WriteLacResponse(txn_id, StatusCode.ENOLEDGER, ledger_id))
        return
    if state.master_key != request.master_key:
        ctx.stats.auth_failures += 1
        conn.reply(WriteLacResponse(txn_id, StatusCode.EUA, ledger_id))
        return

    def done(error: BaseException | None) -> None:
        status = StatusCode.EIO if error is not None else StatusCode.EOK
        conn.reply(WriteLacResponse(txn_id, status, ledger_id, state.lac))

    ledgers.write_lac(state, request.lac, done)
