"""BP-46 boot phase one (BookKeeper's "BP-46: Running without the journal"): after possible data
loss, fence every ledger whose ensembles hold this bookie and put the ones not yet closed in
limbo, before the bookie serves anything.

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

import contextlib
import logging
from dataclasses import dataclass, field

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.context import BookieContext
from aiobk.bookie.cookies import check_cookies, marker_present, set_marker
from aiobk.bookie.disk import Disk
from aiobk.bookie.ledgers import Ledgers
from aiobk.metadata import MetadataStore
from aiobk.protocol.errors import NoSuchLedgerError

log = logging.getLogger(__name__)


@dataclass
class BootResult:
    """What one boot found and did."""

    instance_id: str = ""  # the cookie's: identifies the bookie's directories
    replaced_instances: tuple[str, ...] = ()  # earlier instances a fixed cookie replaced
    unclean_start: bool = False  # the last life did not stop cleanly
    replayed: int = 0  # journal records replayed
    limbo_ledgers: list[int] = field(default_factory=list)  # put in limbo by phase one
    to_repair: list[int] = field(default_factory=list)  # every ledger phase one touched


async def boot(
    ctx: BookieContext,
    disk: Disk,
    store: MetadataStore | None,
    address: str,
    new_instance_id: str,
) -> BootResult:
    """BP-46 "The Full Boot-Up Sequence", up to phase one; nothing is served before it ends.

    1. Cookies and the unclean-shutdown marker.
    2. Ledger storage and the journal after the last checkpoint.
    3. Phase one, after a cookie failure that was fixed, or after an unclean shutdown of a
       journal-less bookie (one with a journal lost nothing it acknowledged): every
       non-closed ledger whose ensembles hold this bookie is fenced and put in limbo.
    """
    config, bookie_id = ctx.config, ctx.admin.bookie_id
    check = await check_cookies(disk, config, store, bookie_id, address, new_instance_id)
    result = BootResult(check.cookie.instance_id, check.replaced_instances)
    if check.fixed:
        log.warning("bookie %s: cookies fixed (%s)", bookie_id, "; ".join(check.problems))
    result.unclean_start = await marker_present(disk, config)
    await set_marker(disk, config)
    storage, journal = ctx.storage, ctx.journal
    mark = await storage.open()  # ledger states load on demand (their sync cursors too)
    result.replayed = await journal.replay(mark, ctx.ledgers.apply, storage.journal_start)
    await journal.start(mark + 1)
    if result.replayed:
        log.info("replayed %d journal records after LSN %d", result.replayed, mark)
        # On a full disk this fails; the journal still holds what it replayed, and the
        # bookie starts anyway (read-only, see bookie.disk_monitor) and retries.
        with contextlib.suppress(Exception):
            await ctx.admin.checkpoint()
    lost_data = check.fixed or (result.unclean_start and not config.journal_write_data)
    if lost_data and store is not None:
        result.limbo_ledgers, result.to_repair = await fence_and_limbo(
            ctx.ledgers, store, config, bookie_id
        )
    return result


async def fence_and_limbo(
    ledgers: Ledgers, store: MetadataStore, config: BookieConfig, bookie_id: str
) -> tuple[list[int], list[int]]:
    """Phase one; returns (ledgers put in limbo, every ledger this bookie holds a part of, for
    the repair phase). Everything is durable when it returns: the records are journaled
    together and one barrier waits for all of them."""
    if not config.boot_fence and not config.boot_limbo:
        return [], []  # protections switched off (tests demonstrating BP-46's scenarios only)
    touched: list[int] = []
    chosen: list[int] = []
    async for ledger_id in store.list_ledgers():
        try:
            metadata = await store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            continue  # deleted meanwhile
        if bookie_id not in metadata.bookies():
            continue
        state = ledgers.get(ledger_id)
        if state is None:
            state = ledgers.create_keyless(ledger_id)
        if config.boot_fence:
            # The guarded fence: a ledger fenced before (and durably so) gets no second record.
            ledgers.start_fence(state)
        if config.boot_limbo and not metadata.is_closed:
            ledgers.set_limbo(state, True)
        touched.append(ledger_id)
        if state.limbo:
            chosen.append(ledger_id)
    await ledgers.durable()
    if chosen:
        log.warning(
            "bookie %s may have lost data: fenced its ledgers, put %d open ones in limbo",
            bookie_id,
            len(chosen),
        )
    return chosen, touched


__all__ = ["BootResult", "boot", "fence_and_limbo"]
