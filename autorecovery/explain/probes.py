"""What to ask the bookies about first, to explain a ledger (``aiobk.autorecovery.explain``):
the copies ``probe_plan`` lists. Pure."""

from __future__ import annotations

from aiobk.autorecovery.explain.model import MAX_FRAGMENTS_CHECKED
from aiobk.autorecovery.fragments import FragmentRange, closed_fragments, slot_bounds
from aiobk.metadata import LedgerMetadata, write_set


def probe_plan(metadata: LedgerMetadata, registered: frozenset[str]) -> list[tuple[str, int]]:
    """The (bookie, entry) pairs to ask about: for each closed fragment (the first
    ``MAX_FRAGMENTS_CHECKED``), each registered bookie's first and last owed entry, and for
    each bookie that is not registered, its first and last owed entry on every registered
    bookie of that entry's write set (where its copies would be read from)."""
    e, wq = metadata.ensemble_size, metadata.write_quorum
    asks: dict[tuple[str, int], None] = {}
    for fragment in closed_fragments(metadata)[:MAX_FRAGMENTS_CHECKED]:
        for slot, bookie in enumerate(fragment.ensemble):
            bounds = slot_bounds(fragment.first, fragment.last, slot, e, wq)
            if bounds is None:
                continue
            for entry in sorted(set(bounds)):
                if bookie in registered:
                    asks.setdefault((bookie, entry), None)
                    continue
                for source in holders(entry, fragment, metadata):
                    if source in registered:
                        asks.setdefault((source, entry), None)
    return list(asks)


def holders(entry: int, fragment: FragmentRange, metadata: LedgerMetadata) -> list[str]:
    """The bookies of ``entry``'s write set in ``fragment``: where its copies are."""
    return [
        fragment.ensemble[s]
        for s in write_set(entry, metadata.ensemble_size, metadata.write_quorum)
    ]


__all__ = ["holders", "probe_plan"]
