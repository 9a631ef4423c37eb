"""READ_LAC and WRITE_LAC: the bookie's last add confirmed, and a writer's explicit LAC.

An explicit LAC lets readers advance without a new add (BookKeeper's ExplicitLac); it is
journaled before the write is acknowledged and raises the LAC only upward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiobk.bookie.journal_format import LEDGER_VALUE, RecordType
from aiobk.protocol import (
    ReadLacRequest,
    ReadLacResponse,
    StatusCode,
    WriteLacRequest,
    WriteLacResponse,
)

if TYPE_CHECKING:
    from aiobk.bookie.connection import ServerConnection
    from aiobk.bookie.server import Bookie


def handle_read_lac(bookie: Bookie, request: ReadLacRequest, conn: ServerConnection) -> None:
    state = bookie.storage.ledgers.get(request.ledger_id)
    if state is None:
        conn.reply(ReadLacResponse(request.txn_id, StatusCode.ENOLEDGER, request.ledger_id))
        return
    conn.reply(
        ReadLacResponse(
            request.txn_id, StatusCode.EOK, request.ledger_id, state.lac, state.max_entry
        )
    )


def handle_write_lac(bookie: Bookie, request: WriteLacRequest, conn: ServerConnection) -> None:
    txn_id, ledger_id = request.txn_id, request.ledger_id
    state = bookie.storage.ledgers.get(ledger_id)
    if state is None:
        conn.reply(WriteLacResponse(txn_id, StatusCode.ENOLEDGER, ledger_id))
        return
    if state.master_key != request.master_key:
        bookie.stats.auth_failures += 1
        conn.reply(WriteLacResponse(txn_id, StatusCode.EUA, ledger_id))
        return
    state.advance_lac(request.lac)

    def done(error: BaseException | None) -> None:
        status = StatusCode.EIO if error is not None else StatusCode.EOK
        conn.reply(WriteLacResponse(txn_id, status, ledger_id, state.lac))

    bookie.journal.append(RecordType.EXPLICIT_LAC, LEDGER_VALUE.pack(ledger_id, request.lac), done)
