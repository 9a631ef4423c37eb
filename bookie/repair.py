"""BP-46 boot phase two, in the background once the bookie serves: recover the ledgers phase
one put in limbo (or wait for a client that can), copy back every entry this bookie should hold
in a closed ledger, then clear limbo.

Recovering and fetching from peers is client work. The bookie never imports the client: the
wiring (``aiobk.runner``, the ``aiobk bookie start`` command, the simulator) hands the bookie a
factory of ``Repairer`` (``aiobk.client.repair.BookieRepairer``). Without one, limbo ledgers stay
in limbo -- safe, since limbo only turns "no such entry" into "unknown" -- and the bookie says so
once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from aiobk.bookie.ledgers import Ledgers
from aiobk.metadata import LedgerMetadata, MetadataStore, write_set
from aiobk.protocol.errors import BKError, NoSuchLedgerError

log = logging.getLogger(__name__)


class Repairer(Protocol):
    """Client-side help for phase two (``aiobk.client.repair.BookieRepairer``)."""

    def can_recover(self, metadata: LedgerMetadata) -> bool: ...

    async def recover(self, ledger_id: int, master_key: bytes) -> LedgerMetadata: ...

    async def fetch(
        self, metadata: LedgerMetadata, ledger_id: int, entry_id: int
    ) -> bytes | None: ...

    async def close(self) -> None: ...


# Builds the repairer of one bookie: (metadata store, bookie id) -> Repairer.
RepairerFactory = Callable[[MetadataStore, str], Repairer]


async def copy_missing(
    ledgers: Ledgers, repairer: Repairer, metadata: LedgerMetadata, ledger_id: int, bookie_id: str
) -> int:
    """Copy from peers every entry this bookie should hold in a closed ledger but does not."""
    state = ledgers.get(ledger_id)
    if state is None:
        return 0  # deleted meanwhile
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    copied = 0
    for index, fragment in enumerate(metadata.fragments):
        if bookie_id not in fragment.ensemble:
            continue
        slot = fragment.ensemble.index(bookie_id)
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
            ledgers.copy(state, entry_id, body)
            copied += 1
    await ledgers.durable()
    return copied


async def repair(
    ledgers: Ledgers,
    store: MetadataStore,
    repairer: Repairer,
    to_repair: list[int],
    bookie_id: str,
    retry: float,
) -> None:
    """Phase two. Retries until every ledger is done or the bookie stops."""
    pending = list(dict.fromkeys(to_repair))
    unsynced: set[int] = set()  # limbo cleared, the record not synced yet
    while pending:
        for ledger_id in list(pending):
            state = ledgers.get(ledger_id)
            try:
                metadata = await store.read_ledger(ledger_id)
                if not metadata.is_closed:
                    if not repairer.can_recover(metadata) or state is None or not state.master_key:
                        continue  # a client with the password will close it; check again later
                    metadata = await repairer.recover(ledger_id, state.master_key)
                if state is not None:
                    copied = await copy_missing(ledgers, repairer, metadata, ledger_id, bookie_id)
                    if copied:
                        log.info("ledger %d: copied %d entries back from peers", ledger_id, copied)
            except NoSuchLedgerError:
                pass  # deleted: nothing to repair
            except (BKError, OSError) as exc:
                # A peer or the metadata unreachable, or this bookie's journal failed (a full
                # disk: JournalFailedError, from the copies' sync) -- try again later. Were the
                # task to end here, the ledger would stay in limbo until the next restart.
                log.warning("ledger %d: repair postponed: %s", ledger_id, exc)
                continue
            try:
                if state is not None and state.limbo:
                    ledgers.set_limbo(state, False)
                    unsynced.add(ledger_id)
                if ledger_id in unsynced:
                    await ledgers.durable()
                    unsynced.discard(ledger_id)
            except OSError as exc:  # the journal failed: the limbo-off record waits with it
                log.warning("ledger %d: repair postponed: %s", ledger_id, exc)
                continue
            pending.remove(ledger_id)
        if pending:
            await asyncio.sleep(retry)
    log.info("bookie %s: repair done", bookie_id)


async def run_repair(
    make_repairer: RepairerFactory | None,
    ledgers: Ledgers,
    store: MetadataStore,
    to_repair: list[int],
    bookie_id: str,
    retry: float,
) -> None:
    """Phase two with the repairer the wiring gave, or -- without one -- a warning."""
    if make_repairer is None:
        limbo = [i for i in to_repair if (state := ledgers.get(i)) is not None and state.limbo]
        log.warning(
            "bookie %s: no repairer was given (run it through `aiobk bookie start`), so %d "
            "ledger(s) stay in limbo and lost entries are not copied back",
            bookie_id,
            len(limbo),
        )
        return
    repairer = make_repairer(store, bookie_id)
    try:
        await repair(ledgers, store, repairer, to_repair, bookie_id, retry)
    finally:
        await repairer.close()


__all__ = ["Repairer", "RepairerFactory", "copy_missing", "repair", "run_repair"]
