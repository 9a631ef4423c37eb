"""Closing a ledger as its writer ("The BookKeeper protocol", "Closing a ledger as a writer").

Compare-and-set the state to CLOSED with the last entry acknowledged to the application. On a
lost race, read the metadata again: still OPEN -> retry on the new version; IN_RECOVERY -> an
error (another client is recovering it); CLOSED with our last entry -> done; CLOSED with another
last entry -> an error. An unreachable metadata store is retried for ``metadata_retry_timeout``
(metadata_retry.py) before the close fails.
"""

from __future__ import annotations

import functools

from aiobk.client.context import ClientContext
from aiobk.client.metadata_retry import MetadataRetry
from aiobk.metadata import LedgerMetadata, LedgerState
from aiobk.protocol.errors import LedgerFencedError, MetadataVersionError


async def close_as_writer(
    ctx: ClientContext, ledger_id: int, metadata: LedgerMetadata, last_entry: int, length: int
) -> LedgerMetadata:
    """Close ``ledger_id`` at ``last_entry`` (``length`` bytes), starting from ``metadata``:
    the version this writer last wrote or read."""
    store, config = ctx.store, ctx.config
    retry = MetadataRetry(config, f"ledger {ledger_id}: close")
    for _attempt in range(config.metadata_retries):
        if metadata.state is LedgerState.CLOSED:
            if metadata.last_entry_id == last_entry:
                return metadata
            raise LedgerFencedError(
                f"ledger {ledger_id} was closed by another client at entry "
                f"{metadata.last_entry_id}; this writer acknowledged up to {last_entry}"
            )
        if metadata.state is LedgerState.IN_RECOVERY:
            raise LedgerFencedError(f"ledger {ledger_id} is being recovered by another client")
        closed = metadata.closed(last_entry, length)
        try:
            return await retry.call(
                "writing CLOSED", functools.partial(store.write_ledger, ledger_id, closed)
            )
        except MetadataVersionError:
            metadata = await retry.call(
                "reading the metadata again", functools.partial(store.read_ledger, ledger_id)
            )
    raise MetadataVersionError(f"ledger {ledger_id}: close still racing")
