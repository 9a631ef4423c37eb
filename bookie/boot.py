"""BP-46 boot phase one: after possible data loss, fence every ledger whose ensembles hold this
bookie and put the ones not yet closed in limbo, before the bookie serves anything.

Fencing stops an old writer from ever reaching an ack quorum through a bookie that forgot it had
been fenced (Scenario 1). Limbo makes this bookie answer EUNKNOWN instead of NoSuchEntry for an
entry it may have lost, so a recovery can never count its forgetting as an explicit negative
(Scenario 2). A ledger this bookie never saw is created for the purpose, with its master key
unknown until a fence or recovery add brings it.

Closed ledgers are fenced too. BP-46's boot sequence says "each non-closed ledger", but its
"Protection Mechanism" fences all of them, and Scenario 1 -- a write landing after the close on
a wiped bookie and one the fence never reached -- is only prevented if the closed ledger is
fenced as well. They are not put in limbo: no recovery reads a closed ledger again, and an
explicit negative from this bookie only sends a reader on to the next one. (Copying their
missing entries back from peers is the repair phase's job.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from bookie.journal_format import LEDGER_PREFIX, LEDGER_VALUE, RecordType
from metadata import MetadataStore
from protocol.errors import NoSuchLedgerError

if TYPE_CHECKING:
    from bookie.server import Bookie

log = logging.getLogger(__name__)


def _noop(error: BaseException | None) -> None:
    """Durability of these records is awaited through the barrier that follows them."""


async def fence_and_limbo(bookie: Bookie, store: MetadataStore) -> list[int]:
    """Phase one; returns the ledgers put in limbo. Everything is durable when it returns."""
    if not bookie.config.boot_fence and not bookie.config.boot_limbo:
        return []  # protections switched off (tests demonstrating BP-46's scenarios only)
    storage, journal = bookie.storage, bookie.journal
    chosen: list[int] = []
    async for ledger_id in store.list_ledgers():
        try:
            metadata = await store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            continue  # deleted meanwhile
        if bookie.bookie_id not in metadata.bookies():
            continue
        state = storage.ledgers.get(ledger_id)
        if state is None:
            state = storage.create(ledger_id, b"")
            journal.append(RecordType.MASTER_KEY, LEDGER_PREFIX.pack(ledger_id), _noop)
        if bookie.config.boot_fence:
            state.fenced = True
            journal.append(RecordType.FENCE, LEDGER_PREFIX.pack(ledger_id), _noop)
        if bookie.config.boot_limbo and not metadata.is_closed:
            state.limbo = True
            journal.append(RecordType.LIMBO, LEDGER_VALUE.pack(ledger_id, 1), _noop)
        state.meta_dirty = True
        if state.limbo:
            chosen.append(ledger_id)
    done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    journal.barrier(done.set_result)
    error = await done
    if error is not None:
        raise error
    if chosen:
        log.warning(
            "bookie %s may have lost data: fenced its ledgers, put %d open ones in limbo",
            bookie.bookie_id,
            len(chosen),
        )
    return chosen
