"""Which of a log's ledgers its offload policy says to offload now: a pure choice over the
log's record and its ledgers' metadata (``OffloadPolicy``, docs/design/tiered-storage.md)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from aiobk.metadata import LedgerMetadata, OffloadPolicy


def due_ledgers(
    ledgers: Sequence[int],
    metadata: Mapping[int, LedgerMetadata],
    policy: OffloadPolicy,
    now_ms: int,
) -> list[int]:
    """The ledgers, in log order, that ``policy`` asks to offload: closed, not offloaded yet,
    and either closed by a roll more than ``older_than`` ago (their next ledger's creation
    time) or wholly beyond the newest ``beyond_bytes`` of the log (the ledgers after it hold
    that much).
    The log's last ledger is never due. A ledger missing from ``metadata`` (deleted
    meanwhile) is skipped."""
    due: set[int] = set()
    if policy.older_than is not None:
        limit = now_ms - policy.older_than * 1000
        for ledger_id, following in itertools.pairwise(ledgers):
            after = metadata.get(following)
            if after is not None and after.creation_time <= limit:
                due.add(ledger_id)
    if policy.beyond_bytes is not None:
        newer = 0  # bytes of the ledgers after this one
        for ledger_id in reversed(ledgers):
            if newer >= policy.beyond_bytes:
                due.add(ledger_id)
            newer += metadata[ledger_id].length if ledger_id in metadata else 0
    return [
        ledger_id
        for ledger_id in ledgers[:-1]
        if ledger_id in due
        and ledger_id in metadata
        and metadata[ledger_id].is_closed
        and metadata[ledger_id].offload is None
    ]


__all__ = ["due_ledgers"]
