"""What a ledger's fragments hold, bookie by bookie, and how one copy moves to a new bookie: the
pure part of autorecovery (no I/O; the auditor's checks and the workers' repairs build on it).

Theory of operation ("A Guide to the BookKeeper Replication Protocol", "Ledger Fragments"; "The
BookKeeper protocol", "Write quorums"). A fragment is a range of
entries written to one ensemble; entry ``e`` lives on the ``WQ`` slots from ``e mod E``. So the
copies one slot of a fragment owes are the entries of the fragment's range whose write set
names that slot. A fragment's range is closed -- its entries will never change -- when a later
fragment follows it, or when the ledger is closed (the last fragment ends at the last entry).
The last fragment of a ledger that is still open is the writer's: autorecovery leaves it alone
until the ledger is closed (by its writer, or by a worker's recovery after
``open_ledger_rereplication_grace_period``).

A repair replaces one bookie in one closed fragment: copy the entries the slot owes from the
other copies to a bookie not in that fragment's ensemble, then change the fragment's ensemble by
a compare-and-set on the version read before copying. ``replace_bookie`` is that change, and it
refuses (None) when the fragment it was computed for is no longer there as it was -- someone
else changed it meanwhile -- so the caller reads again rather than writing over them.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass

from aiobk.metadata import Fragment, LedgerMetadata, LedgerState, write_set


@dataclass(frozen=True, slots=True)
class FragmentRange:
    index: int  # position in metadata.fragments
    first: int  # first entry id
    last: int  # last entry id (first - 1: an empty fragment)
    ensemble: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return self.last < self.first


def closed_fragments(metadata: LedgerMetadata) -> list[FragmentRange]:
    """The fragments whose ranges can no longer change: all but the last of an open ledger,
    every one of a closed ledger (the last ends at its last entry)."""
    fragments = metadata.fragments
    closed = metadata.state is LedgerState.CLOSED
    end = metadata.last_entry_id if closed else None
    out: list[FragmentRange] = []
    for index, fragment in enumerate(fragments):
        if index + 1 < len(fragments):
            last = fragments[index + 1].first_entry_id - 1
        elif closed:
            assert end is not None
            last = end
        else:
            break
        if end is not None:
            # A fragment a writer started at an entry that recovery then found absent holds
            # nothing past the ledger's last entry.
            last = min(last, end)
        out.append(FragmentRange(index, fragment.first_entry_id, last, fragment.ensemble))
    return out


def open_fragment(metadata: LedgerMetadata) -> Fragment | None:
    """The writer's fragment of a ledger not closed yet (None when closed)."""
    if metadata.state is LedgerState.CLOSED:
        return None
    return metadata.fragments[-1]


def slot_entries(
    first: int, last: int, slot: int, ensemble_size: int, write_quorum: int
) -> Iterator[int]:
    """The entries in [first, last] whose write set names ``slot``, ascending: with E == WQ
    every entry; otherwise WQ of every E consecutive ids (visited in steps, not one by one)."""
    if write_quorum >= ensemble_size:
        yield from range(first, last + 1)
        return
    # Entry e is on slot s when (s - e) mod E < WQ, i.e. e mod E in s-WQ+1 .. s (mod E).
    residues = _residues(slot, ensemble_size, write_quorum)
    base = first - first % ensemble_size
    while base <= last:
        for residue in residues:
            entry = base + residue
            if first <= entry <= last:
                yield entry
        base += ensemble_size


def slot_bounds(
    first: int, last: int, slot: int, ensemble_size: int, write_quorum: int
) -> tuple[int, int] | None:
    """The first and last entries the slot owes in [first, last]; None if it owes none."""
    low = next(slot_entries(first, last, slot, ensemble_size, write_quorum), None)
    if low is None:
        return None
    high = last
    while slot not in write_set(high, ensemble_size, write_quorum):
        high -= 1
    return low, high


def check_points(
    fragment: FragmentRange,
    slot: int,
    metadata: LedgerMetadata,
    percentage: float,
    rng: random.Random,
) -> list[int]:
    """The entries to ask the slot's bookie about (BookKeeper's LedgerChecker): the first and
    last it owes, and ``percentage`` of the rest, distinct and chosen at random (at 100, every
    entry it owes)."""
    e, wq = metadata.ensemble_size, metadata.write_quorum
    first, last = fragment.first, fragment.last
    if percentage >= 100:
        return list(slot_entries(first, last, slot, e, wq))
    owed = owed_count(first, last, slot, e, wq)
    if owed == 0:
        return []
    picks = {0, owed - 1}
    wanted = min(owed, int(owed * percentage / 100))
    if wanted > len(picks):
        picks.update(rng.sample(range(owed), wanted))
    return sorted(nth_owed(first, slot, e, wq, index) for index in picks)


def _residues(slot: int, ensemble_size: int, write_quorum: int) -> list[int]:
    return sorted((slot - offset) % ensemble_size for offset in range(write_quorum))


def owed_count(first: int, last: int, slot: int, ensemble_size: int, write_quorum: int) -> int:
    """How many entries in [first, last] the slot owes (``slot_entries``, counted)."""
    if last < first:
        return 0
    if write_quorum >= ensemble_size:
        return last - first + 1

    def upto(end: int) -> int:  # owed entries in [0, end)
        full, rest = divmod(end, ensemble_size)
        return full * write_quorum + sum(
            1 for r in _residues(slot, ensemble_size, write_quorum) if r < rest
        )

    return upto(last + 1) - upto(first)


def nth_owed(first: int, slot: int, ensemble_size: int, write_quorum: int, index: int) -> int:
    """The ``index``-th (from 0) entry at or after ``first`` that the slot owes."""
    if write_quorum >= ensemble_size:
        return first + index
    residues = _residues(slot, ensemble_size, write_quorum)
    base = first - first % ensemble_size
    skipped = sum(1 for r in residues if base + r < first)  # owed before first, same block
    block, position = divmod(index + skipped, write_quorum)
    return base + block * ensemble_size + residues[position]


def holders(entry_id: int, fragment: FragmentRange, metadata: LedgerMetadata) -> list[str]:
    """The bookies of the fragment's ensemble that should hold ``entry_id``."""
    return [
        fragment.ensemble[slot]
        for slot in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
    ]


def replace_bookie(
    metadata: LedgerMetadata, fragment: FragmentRange, slot: int, replacement: str
) -> LedgerMetadata | None:
    """The metadata with ``replacement`` in the fragment's ``slot``; None if that fragment is
    no longer as ``fragment`` describes it (its first entry, its ensemble, its end: the
    ledger was changed by somebody else since), so the copy made for it may not fit."""
    current = next((r for r in closed_fragments(metadata) if r.first == fragment.first), None)
    if current is None or current.ensemble != fragment.ensemble or current.last != fragment.last:
        return None
    ensemble = list(current.ensemble)
    ensemble[slot] = replacement
    fragments = list(metadata.fragments)
    fragments[current.index] = Fragment(current.first, tuple(ensemble))
    return dataclasses.replace(metadata, fragments=tuple(fragments))


def bookies_named(metadata: LedgerMetadata) -> set[str]:
    """Every bookie in any of the ledger's ensembles."""
    return {bookie for fragment in metadata.fragments for bookie in fragment.ensemble}


__all__ = [
    "FragmentRange",
    "bookies_named",
    "check_points",
    "closed_fragments",
    "holders",
    "nth_owed",
    "open_fragment",
    "owed_count",
    "replace_bookie",
    "slot_bounds",
    "slot_entries",
]
