"""A writer's ensemble change (protocol.md "Writing to ledgers", last bullets).

Replacements come from the registry's writable bookies, excluding the current ensemble and every
bookie known to have failed. The new fragment starts at LAC + 1 and reaches the metadata by
compare-and-set. On a lost race the metadata is read again: a ledger no longer OPEN means a
recovery started, so the writer stops for good (``LedgerFencedError``) and never writes the
metadata again; an OPEN ledger changed by someone else gets the fragment added to its newer
version.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from client.placement import choose_replacement
from metadata import LedgerState
from protocol.errors import LedgerFencedError, MetadataStoreError, MetadataVersionError

if TYPE_CHECKING:
    from client.add import ReplacementsChosen
    from client.ledger_handle import LedgerHandle


async def change_ensemble(
    handle: LedgerHandle,
    first_entry: int,
    ensemble: list[str],
    failed: dict[int, str],
    rng: random.Random,
    chosen: ReplacementsChosen | None = None,
) -> list[str]:
    handle.bad_bookies.update(failed.values())
    candidates = await handle.pool.writable_bookies(fresh=True)
    new = list(ensemble)
    for slot in sorted(failed):
        new[slot] = choose_replacement(candidates, new, handle.bad_bookies, rng)
    if chosen is not None:  # ProtocolSwitches.replace_after_cas off: write before the CAS
        chosen(list(new))
    store = handle.store
    metadata = handle.metadata
    retries = handle.config.metadata_retries
    for attempt in range(retries):
        wanted = metadata.with_fragment(first_entry, tuple(new))
        try:
            handle.metadata = await store.write_ledger(handle.ledger_id, wanted)
            return new
        except MetadataVersionError:
            current = await store.read_ledger(handle.ledger_id)
            if current.state is not LedgerState.OPEN:
                handle.fenced = True
                raise LedgerFencedError(
                    f"ledger {handle.ledger_id} is {current.state.value}: another client is "
                    "recovering or closed it"
                ) from None
            metadata = current
        except MetadataStoreError:
            if attempt == retries - 1:
                raise
            await asyncio.sleep(min(0.05 * (attempt + 1), 1.0))
    raise MetadataVersionError(
        f"ledger {handle.ledger_id}: ensemble change still racing after {retries} attempts"
    )
