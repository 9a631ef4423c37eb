"""Where an offloaded ledger's copy is, as its metadata records it."""

from __future__ import annotations

from aiobk.metadata import LedgerMetadata, OffloadState
from aiobk.tiered.objects import OffloadRef


def offload_ref(ledger_id: int, metadata: LedgerMetadata) -> OffloadRef | None:
    """The object holding the ledger, once its copy is complete (copied or released); None
    while there is none to read (never offloaded, or a copy in progress)."""
    record = metadata.offload
    if record is None or record.state is OffloadState.COPYING:
        return None
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    return OffloadRef(
        url=record.store,
        key=record.key,
        ledger_id=ledger_id,
        first_entry=0,
        last_entry=last,
        size=record.size,
        index_offset=record.index_offset,
        index_length=record.index_length,
        index_crc=record.index_crc,
        digest_type=int(metadata.digest_type),
    )


def is_released(metadata: LedgerMetadata) -> bool:
    """Whether the bookies may have dropped the ledger: only its object holds it."""
    return metadata.offload is not None and metadata.offload.state is OffloadState.RELEASED


__all__ = ["is_released", "offload_ref"]
