"""Quorum math, pure ("The BookKeeper protocol", "Write quorums"; "A Guide to the BookKeeper
Replication Protocol", "Operations and the Different Quorums"; BookKeeper's "BP-14: Relax
durability", "LAC Advance Protocol").

Slots are indices into an ensemble. The write set of entry e is the WQ consecutive slots
starting at e mod E, wrapping. AQ acks from the write set commit an entry. QC = WQ - AQ + 1 and
EC = E - AQ + 1 are the coverage thresholds: a property held by at least QC bookies of a write
set (EC of an ensemble, when E = WQ) is held by at least one bookie of every ack quorum in it.
With striping (E > WQ) an ack quorum lies inside one write set, so the ensemble is covered when
every one of its E write sets is covered (BookKeeper's RRQuorumCoverageSet) -- which for E = WQ
is exactly EC responses.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from aiobk.metadata.model import write_set

__all__ = [
    "covered",
    "coverage_impossible",
    "ensemble_coverage",
    "lac_from_last_add_synced",
    "quorum_coverage",
    "write_set",
]


def quorum_coverage(write_quorum: int, ack_quorum: int) -> int:
    """QC: responses from one write set that leave no ack quorum without one of them."""
    return write_quorum - ack_quorum + 1


def ensemble_coverage(ensemble_size: int, ack_quorum: int) -> int:
    """EC: the same over a whole ensemble."""
    return ensemble_size - ack_quorum + 1


def covered(ensemble_size: int, write_quorum: int, ack_quorum: int, slots: Collection[int]) -> bool:
    """True when every ack quorum of every write set contains one of ``slots``."""
    need = quorum_coverage(write_quorum, ack_quorum)
    for start in range(ensemble_size):
        have = sum(1 for i in range(write_quorum) if (start + i) % ensemble_size in slots)
        if have < need:
            return False
    return True


def coverage_impossible(
    ensemble_size: int, write_quorum: int, ack_quorum: int, failed: Collection[int]
) -> bool:
    """True when ``failed`` slots leave some write set unable ever to be covered: at least AQ
    of its bookies failed (the replication protocol guide: fencing is unknown at "AQ unknown
    responses")."""
    for start in range(ensemble_size):
        lost = sum(1 for i in range(write_quorum) if (start + i) % ensemble_size in failed)
        if lost >= ack_quorum:
            return True
    return False


def lac_from_last_add_synced(synced: Sequence[int], write_quorum: int, ack_quorum: int) -> int:
    """BP-14: sort the LastAddSynced values ascending, take the max of the first WQ-AQ+1.

    BP-14's example, ensemble A, B, C with LastAddSynced 1, 2, 3: AQ=1 -> 3, AQ=2 -> 2, AQ=3 -> 1.
    The result is synced on at least AQ bookies: only WQ-AQ of them may be below it.
    """
    ordered = sorted(synced)
    return max(ordered[: write_quorum - ack_quorum + 1])
