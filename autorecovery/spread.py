"""Keeping a ledger's copies spread over racks: the pure decisions behind the auditor's placement
check and the workers' placement repairs (no I/O; BookKeeper 4.16's auditor checks placement
policy adherence in a periodic pass).

A write set of a closed fragment is short when it spans fewer racks than
``min_racks_per_write_quorum`` (at most its write quorum): the fragment was placed while a rack
was down or unregistered, or its bookies moved racks since. Racks are the registered bookies'
now (``cluster_spread``). A fragment naming a bookie that is not registered is left out: its
copies are the lost-bookie repair's, whose replacement spreads.

A repair moves one copy at a time (``next_move``): in the first short write set, a slot whose
rack another slot of that set shares, to a writable bookie outside the ensemble whose rack makes
the fragment's write sets better spread (``score``: fewer short sets, then the fewest racks any
set spans, then the racks all sets span together). Only targets that raise the score count, so
a move is offered only when one would help -- with too few racks, none is, the auditor does not
mark the ledger, and a worker given such a mark finds nothing to do and drops it. Each move
raises a bounded score, so a fragment takes at most a few moves.

Open ledgers: only their closed fragments are checked; the writer's fragment is the writer's,
whose ensemble changes place spread, and is checked once the ledger is closed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from aiobk.autorecovery.fragments import FragmentRange, closed_fragments
from aiobk.client.placement import Spread, write_sets
from aiobk.metadata import BookieServiceInfo, LedgerMetadata


def cluster_spread(infos: Iterable[BookieServiceInfo], min_racks: int) -> Spread:
    """The racks of the registered bookies, and the racks a write set should span; never
    enforced (a repair spreads as far as the cluster allows)."""
    return Spread({info.bookie_id: info.rack for info in infos}, min_racks, enforce=False)


def score(ensemble: tuple[str, ...], write_quorum: int, spread: Spread) -> tuple[int, int, int]:
    """How well ``ensemble``'s write sets spread: (minus the sets short of the racks wanted,
    the fewest racks a set spans, the racks all sets span together); higher is better."""
    quorum = min(write_quorum, len(ensemble))
    wanted = min(spread.min_racks, quorum)
    spans = [
        len({spread.rack(ensemble[s]) for s in slots})
        for slots in write_sets(len(ensemble), quorum)
    ]
    return (-sum(span < wanted for span in spans), min(spans), sum(spans))


def short_sets(
    ensemble: tuple[str, ...], write_quorum: int, spread: Spread
) -> list[tuple[int, ...]]:
    """The write sets (slots) of ``ensemble`` spanning fewer racks than wanted."""
    quorum = min(write_quorum, len(ensemble))
    wanted = min(spread.min_racks, quorum)
    return [
        slots
        for slots in write_sets(len(ensemble), quorum)
        if len({spread.rack(ensemble[s]) for s in slots}) < wanted
    ]


@dataclass(frozen=True, slots=True)
class Move:
    """One copy to move for the spread: ``slot`` of ``fragment`` to one of ``targets`` (each
    raises the fragment's score; the worker's placement picks among them)."""

    fragment: FragmentRange
    slot: int
    targets: tuple[str, ...]


def fragment_move(
    fragment: FragmentRange,
    write_quorum: int,
    spread: Spread,
    writable: Collection[str],
) -> Move | None:
    """The move that spreads ``fragment`` (see the module docstring), or None: it spreads
    already, names an unregistered bookie, or no writable bookie would spread it further."""
    ensemble = fragment.ensemble
    if fragment.empty or any(b not in spread.racks for b in ensemble):
        return None
    short = short_sets(ensemble, write_quorum, spread)
    if not short:
        return None
    now = score(ensemble, write_quorum, spread)
    outside = sorted(set(writable) - set(ensemble))
    for slots in short:
        racks = [spread.rack(ensemble[s]) for s in slots]
        # A slot whose rack the set holds twice; the most crowded rack's last slot first.
        crowded = sorted(
            (s for s, r in zip(slots, racks, strict=True) if racks.count(r) > 1),
            key=lambda s: (-racks.count(spread.rack(ensemble[s])), -slots.index(s)),
        )
        for slot in crowded:
            targets = tuple(
                b
                for b in outside
                if score((*ensemble[:slot], b, *ensemble[slot + 1 :]), write_quorum, spread) > now
            )
            if targets:
                return Move(fragment, slot, targets)
    return None


def next_move(
    metadata: LedgerMetadata,
    spread: Spread,
    writable: Collection[str],
    skip: Collection[int] = (),
) -> Move | None:
    """The first move of the ledger's closed fragments (those at indexes in ``skip`` left
    out), or None when none spreads them further."""
    for fragment in closed_fragments(metadata):
        if fragment.index in skip:
            continue
        move = fragment_move(fragment, metadata.write_quorum, spread, writable)
        if move is not None:
            return move
    return None


def misplaced(metadata: LedgerMetadata, spread: Spread, writable: Collection[str]) -> bool:
    """Whether the auditor marks the ledger for its placement: some closed fragment has a short
    write set that a move would spread."""
    if spread.min_racks < 2:
        return False
    return next_move(metadata, spread, writable) is not None


def rack_layout(infos: Iterable[BookieServiceInfo]) -> frozenset[tuple[str, str, bool]]:
    """What the placement check depends on in the registry: each bookie's rack and whether it
    is writable (a change runs the check again)."""
    return frozenset((info.bookie_id, info.rack, info.writable) for info in infos)


__all__ = [
    "Move",
    "cluster_spread",
    "fragment_move",
    "misplaced",
    "next_move",
    "rack_layout",
    "score",
    "short_sets",
]
