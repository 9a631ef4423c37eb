"""Reading one entry from one bookie, and checking what came back: the step every reader of
entries shares (``read.EntryReader``, recovery's reads, the bookie repairer's copies).

``ask`` sends the READ and returns the bookie's ``ReadResponse`` whatever its status; any other
answer -- an ``ErrorResponse`` to a request the bookie could not take -- is ``BadRequestError``
(it used to fail an assertion). ``verified`` parses a body and checks its digest: the
(ledger, entry) in the body must be the ones asked for, and the digest must match, or it is
``DigestMismatchError`` naming the bookie (a damaged or misplaced copy is never served).
"""

from __future__ import annotations

from aiobk.client.connection import status_error
from aiobk.client.digest import Digester
from aiobk.client.pool import BookiePool
from aiobk.protocol import (
    EntryBody,
    MalformedEntryError,
    ReadFlag,
    ReadRequest,
    ReadResponse,
    parse_entry,
)
from aiobk.protocol.errors import DigestMismatchError


async def ask(
    pool: BookiePool,
    bookie: str,
    ledger_id: int,
    entry_id: int,
    timeout: float,
    flags: ReadFlag = ReadFlag.NONE,
    master_key: bytes = b"",
) -> ReadResponse:
    """Send one READ to ``bookie``; its answer (any status)."""
    conn = await pool.get(bookie)
    request = ReadRequest(conn.next_txn_id(), ledger_id, entry_id, flags, master_key)
    response = await conn.send(request, timeout)
    if not isinstance(response, ReadResponse):
        raise status_error(response, bookie)  # an ErrorResponse: BadRequestError
    return response


def verified(
    body: bytes, digest: Digester, ledger_id: int, entry_id: int, bookie: str
) -> EntryBody:
    """``body`` parsed, its digest checked (see the module docstring)."""
    try:
        parsed = parse_entry(body)
        digest.verify(parsed, ledger_id, entry_id)
    except (MalformedEntryError, DigestMismatchError) as exc:
        raise DigestMismatchError(f"bookie {bookie}: {exc}") from None
    return parsed


__all__ = ["ask", "verified"]
