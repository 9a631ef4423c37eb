"""Closing a ledger as its writer (protocol.md "Closing a ledger as a writer").

Compare-and-set the state to CLOSED with the last entry acknowledged to the application. On a
lost race, read the metadata again: still OPEN -> retry on the new version; IN_RECOVERY -> an
error (another client is recovering it); CLOSED with our last entry -> done; CLOSED with another
last entry -> an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metadata import LedgerMetadata, LedgerState
from protocol.errors import LedgerFencedError, MetadataVersionError

if TYPE_CHECKING:
    from client.ledger_handle import LedgerHandle


async def close_as_writer(handle: LedgerHandle, last_entry: int, length: int) -> LedgerMetadata:
    metadata = handle.metadata
    for _attempt in range(handle.config.metadata_retries):
        if metadata.state is LedgerState.CLOSED:
            if metadata.last_entry_id == last_entry:
                return metadata
            raise LedgerFencedError(
                f"ledger {handle.ledger_id} was closed by another client at entry "
                f"{metadata.last_entry_id}; this writer acknowledged up to {last_entry}"
            )
        if metadata.state is LedgerState.IN_RECOVERY:
            raise LedgerFencedError(
                f"ledger {handle.ledger_id} is being recovered by another client"
            )
        try:
            return await handle.store.write_ledger(
                handle.ledger_id, metadata.closed(last_entry, length)
            )
        except MetadataVersionError:
            metadata = await handle.store.read_ledger(handle.ledger_id)
    raise MetadataVersionError(f"ledger {handle.ledger_id}: close still racing")
