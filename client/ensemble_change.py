"""A writer's ensemble change ("The BookKeeper protocol", "Writing to ledgers", last bullets).

Replacements come from the registry's writable bookies, excluding the current ensemble and every
bookie known to have failed. The new fragment starts at LAC + 1 and reaches the metadata by
compare-and-set. On a lost race the metadata is read again: a ledger no longer OPEN means a
recovery started, so the writer stops for good (``LedgerFencedError``) and never writes the
metadata again; an OPEN ledger changed by someone else gets the fragment added to its newer
version.

An unreachable metadata store (etcd restarting) is retried with backoff for
``metadata_retry_timeout`` (metadata_retry.py) before the change fails, and with it the ledger.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiobk.client.context import ClientContext
from aiobk.client.metadata_retry import MetadataRetry
from aiobk.client.placement import choose_replacement
from aiobk.metadata import LedgerMetadata, LedgerState
from aiobk.protocol.errors import LedgerFencedError, MetadataVersionError

if TYPE_CHECKING:
    from aiobk.client.add import ReplacementsChosen


async def change_ensemble(
    ctx: ClientContext,
    ledger_id: int,
    current: Callable[[], LedgerMetadata],
    first_entry: int,
    ensemble: list[str],
    failed: dict[int, str],
    bad: set[str],
    chosen: ReplacementsChosen | None = None,
) -> tuple[list[str], LedgerMetadata]:
    """Replace the ``failed`` slots of ``ensemble`` in a new fragment from ``first_entry``;
    return the new ensemble and the metadata written. ``current()`` is the writer's latest
    metadata, read when the CAS is attempted (a close may not race past it); ``bad`` are the
    bookies never to choose."""
    store, config = ctx.store, ctx.config
    # The listing, the CAS and the re-reads ride out an unreachable store together, for
    # metadata_retry_timeout; acknowledgements stay held meanwhile (the pipeline is changing).
    retry = MetadataRetry(config, f"ledger {ledger_id}: ensemble change")
    candidates = await retry.call(
        "listing the writable bookies", functools.partial(ctx.pool.writable_bookies, fresh=True)
    )
    new = list(ensemble)
    for slot in sorted(failed):
        new[slot] = choose_replacement(candidates, new, bad, ctx.rng)
    if chosen is not None:  # ProtocolSwitches.replace_after_cas off: write before the CAS
        chosen(list(new))
    metadata = current()
    retries = config.metadata_retries
    for _attempt in range(retries):
        wanted = metadata.with_fragment(first_entry, tuple(new))
        try:
            written = await retry.call(
                "writing the new fragment", functools.partial(store.write_ledger, ledger_id, wanted)
            )
            ctx.stats.ensemble_changes += 1
            return new, written
        except MetadataVersionError:
            latest = await retry.call(
                "reading the metadata again", functools.partial(store.read_ledger, ledger_id)
            )
            if latest.state is not LedgerState.OPEN:
                raise LedgerFencedError(
                    f"ledger {ledger_id} is {latest.state.value}: another client is "
                    "recovering or closed it"
                ) from None
            metadata = latest
    raise MetadataVersionError(
        f"ledger {ledger_id}: ensemble change still racing after {retries} attempts"
    )
