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
import importlib
import logging
from typing import TYPE_CHECKING, Protocol

from aiobk.bookie.journal_format import LEDGER_PREFIX, LEDGER_VALUE, RecordType, add_payload
from aiobk.metadata import LedgerMetadata, MetadataStore, write_set
from aiobk.protocol.errors import BKError, NoSuchLedgerError

if TYPE_CHECKING:
    from aiobk.bookie.server import Bookie

log = logging.getLogger(__name__)


def _noop(error: BaseException | None) -> None:
    """Durability of these records is awaited through the barrier that follows them."""


async def fence_and_limbo(bookie: Bookie, store: MetadataStore) -> tuple[list[int], list[int]]:
    """Phase one; returns (ledgers put in limbo, every ledger this bookie holds a part of, for
    the repair phase). Everything is durable when it returns."""
    if not bookie.config.boot_fence and not bookie.config.boot_limbo:
        return [], []  # protections switched off (tests demonstrating BP-46's scenarios only)
    touched: list[int] = []
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
        touched.append(ledger_id)
        if state.limbo:
            chosen.append(ledger_id)
    await _durable(bookie)
    if chosen:
        log.warning(
            "bookie %s may have lost data: fenced its ledgers, put %d open ones in limbo",
            bookie.bookie_id,
            len(chosen),
        )
    return chosen, touched


class Repairer(Protocol):
    """Client-side help for phase two (``client.repair.BookieRepairer``, loaded at run time)."""

    def can_recover(self, metadata: LedgerMetadata) -> bool: ...

    async def recover(self, ledger_id: int, master_key: bytes) -> LedgerMetadata: ...

    async def fetch(
        self, metadata: LedgerMetadata, ledger_id: int, entry_id: int
    ) -> bytes | None: ...

    async def close(self) -> None: ...


REPAIRER = "client.repair:BookieRepairer"


def load_repairer(store: MetadataStore, bookie_id: str) -> Repairer:
    """The client's repairer, imported by name so that ``bookie`` has no import of ``client``."""
    module_name, _sep, attribute = REPAIRER.partition(":")
    factory = getattr(importlib.import_module(module_name), attribute)
    repairer: Repairer = factory(store, bookie_id)
    return repairer


async def _durable(bookie: Bookie) -> None:
    """Until every journal record so far is synced. The waiter may be cancelled (a stopping
    bookie cancels its repair), so the barrier resolves it only if still pending."""
    done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def resolve(error: BaseException | None) -> None:
        if not done.done():
            done.set_result(error)

    bookie.journal.barrier(resolve)
    error = await done
    if error is not None:
        raise error


async def copy_missing(
    bookie: Bookie, repairer: Repairer, metadata: LedgerMetadata, ledger_id: int
) -> int:
    """Copy from peers every entry this bookie should hold in a closed ledger but does not."""
    state = bookie.storage.ledgers[ledger_id]
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    copied = 0
    for index, fragment in enumerate(metadata.fragments):
        if bookie.bookie_id not in fragment.ensemble:
            continue
        slot = fragment.ensemble.index(bookie.bookie_id)
        end = (
            metadata.fragments[index + 1].first_entry_id - 1
            if index + 1 < len(metadata.fragments)
            else last
        )
        for entry_id in range(fragment.first_entry_id, min(end, last) + 1):
            if state.location(entry_id) >= 0:
                continue
            if slot not in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum):
                continue
            body = await repairer.fetch(metadata, ledger_id, entry_id)
            if body is None:
                raise BKError(f"ledger {ledger_id}: no peer has a good copy of entry {entry_id}")
            bookie.storage.add_entry(state, entry_id, body)
            bookie.journal.append(RecordType.ADD, add_payload(ledger_id, entry_id, body), _noop)
            copied += 1
    await _durable(bookie)
    return copied


async def repair(
    bookie: Bookie, store: MetadataStore, repairer: Repairer, ledgers: list[int], retry: float
) -> None:
    """Phase two: recover limbo ledgers (or wait for someone who can), copy back what this
    bookie should hold, then clear limbo. Retries until every ledger is done or the bookie
    stops."""
    pending = list(dict.fromkeys(ledgers))
    while pending:
        for ledger_id in list(pending):
            state = bookie.storage.ledgers.get(ledger_id)
            try:
                metadata = await store.read_ledger(ledger_id)
                if not metadata.is_closed:
                    if not repairer.can_recover(metadata) or state is None or not state.master_key:
                        continue  # a client with the password will close it; check again later
                    metadata = await repairer.recover(ledger_id, state.master_key)
                if state is not None:
                    copied = await copy_missing(bookie, repairer, metadata, ledger_id)
                    if copied:
                        log.info("ledger %d: copied %d entries back from peers", ledger_id, copied)
            except NoSuchLedgerError:
                pass  # deleted: nothing to repair
            except BKError as exc:
                log.warning("ledger %d: repair postponed: %s", ledger_id, exc)
                continue
            if state is not None and state.limbo:
                state.limbo = False
                state.meta_dirty = True
                bookie.journal.append(RecordType.LIMBO, LEDGER_VALUE.pack(ledger_id, 0), _noop)
                await _durable(bookie)
            pending.remove(ledger_id)
        if pending:
            await asyncio.sleep(retry)
    log.info("bookie %s: repair done", bookie.bookie_id)
