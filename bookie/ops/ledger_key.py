"""LEDGER_KEY: a ledger's master key, for an autorecovery replication worker that proves it
knows the cluster's secret.

A worker copying a lost bookie's entries to a new bookie writes them with RECOVERY_ADD, and a
worker closing an abandoned ledger fences it: both carry the ledger's master key, which only the
bookies holding the ledger know (the metadata keeps a digest of the password, not the key).
The request carries ``key_request_proof(secret, ledger_id)``; the secret lives in the metadata
store (``AutoRecoveryStore.cluster_secret``), so a peer that reaches only the bookie port gets
EUA, and a bookie that cannot read the store answers EIO (ask again later).
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from aiobk.protocol import LedgerKeyRequest, LedgerKeyResponse, StatusCode, key_request_proof
from aiobk.protocol.errors import BKError

if TYPE_CHECKING:
    from aiobk.bookie.context import BookieContext, Replier


def handle_ledger_key(ctx: BookieContext, request: LedgerKeyRequest, conn: Replier) -> None:
    async def answer() -> None:
        try:
            secret = await ctx.admin.cluster_secret()
        except BKError:
            conn.reply(LedgerKeyResponse(request.txn_id, StatusCode.EIO, request.ledger_id))
            return
        proof = b"" if secret is None else key_request_proof(secret, request.ledger_id)
        if secret is None or not hmac.compare_digest(proof, request.proof):
            ctx.stats.auth_failures += 1
            conn.reply(LedgerKeyResponse(request.txn_id, StatusCode.EUA, request.ledger_id))
            return
        state = ctx.ledgers.get(request.ledger_id)
        if state is None:
            conn.reply(LedgerKeyResponse(request.txn_id, StatusCode.ENOLEDGER, request.ledger_id))
        else:
            conn.reply(
                LedgerKeyResponse(
                    request.txn_id, StatusCode.EOK, request.ledger_id, state.master_key
                )
            )

    conn.spawn(answer())
