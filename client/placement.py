"""Choosing bookies for an ensemble or a replacement, pure given the candidates and a seeded
random source (no global random: the simulator replays placement exactly).

Failure domains (docs/design/placement.md). Each bookie is in a rack, ``/ZONE/RACK``. An entry
is stored on its write set: ``write_quorum`` consecutive slots of the ensemble, wrapping round
(``write_sets``), so with striping (ensemble larger than the write quorum) an ensemble has as
many write sets as slots. A placement spreads when every write set spans at least
``Spread.min_racks`` racks -- losing one rack then never takes every copy of an entry -- and as
many zones as it can.

The choice is greedy, slot by slot: each slot takes a bookie that keeps the write sets through
it on the most racks, then zones, then from the rack with the most bookies left (so small racks
are not used up first), random among equals. Greed can paint itself into a corner where the
write sets wrap round (the last slots meet the first), so a repair pass then swaps slots, or a
slot with an unused candidate, while that spreads the worst write set further. When every
candidate is in one rack there is nothing to spread and the choice is the plain random one,
drawing from the random source exactly as a cluster without racks does.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from aiobk.metadata import DEFAULT_RACK, zone_of
from aiobk.protocol.errors import NotEnoughBookiesError


@dataclass(frozen=True, slots=True)
class Spread:
    """How copies must spread: each bookie's rack (a bookie not named is in the default rack),
    the racks every write set spans at least, and whether a placement that cannot is refused
    (``NotEnoughBookiesError``) or made and reported (``shortfall``)."""

    racks: Mapping[str, str] = field(default_factory=dict)
    min_racks: int = 2
    enforce: bool = False

    def rack(self, bookie: str) -> str:
        return self.racks.get(bookie, DEFAULT_RACK)

    def wanted(self, usable: Collection[str], write_quorum: int) -> int:
        """Racks each write set must span: ``min_racks`` (at most the write quorum); unless
        enforced, no more than the candidates are in."""
        wanted = min(self.min_racks, write_quorum)
        if self.enforce:
            return wanted
        return min(wanted, len({self.rack(b) for b in usable}))


def write_sets(ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """The slots of each write set: entry ``e`` is on ``write_sets(E, WQ)[e % E]``."""
    return [
        tuple((first + i) % ensemble_size for i in range(write_quorum))
        for first in range(ensemble_size)
    ]


def spread_of(ensemble: Sequence[str], write_quorum: int, spread: Spread) -> tuple[int, int]:
    """The fewest racks, and the fewest zones, any write set of ``ensemble`` spans."""
    racks = [spread.rack(b) for b in ensemble]
    sets = write_sets(len(ensemble), min(write_quorum, len(ensemble)))
    return (
        min(len({racks[s] for s in slots}) for slots in sets),
        min(len({zone_of(racks[s]) for s in slots}) for slots in sets),
    )


def shortfall(ensemble: Sequence[str], write_quorum: int, spread: Spread) -> str | None:
    """Why ``ensemble`` breaks the spread the cluster allows (None: it does not)."""
    wanted = spread.wanted(spread.racks.keys() | set(ensemble), write_quorum)
    racks, _zones = spread_of(ensemble, write_quorum, spread)
    if racks >= wanted:
        return None
    return (
        f"a write set of {write_quorum} spans {racks} rack(s), fewer than "
        f"min_racks_per_write_quorum={spread.min_racks} (the cluster has "
        f"{len(set(spread.racks.values()) | {spread.rack(b) for b in ensemble})})"
    )


def _refuse(size: int, write_quorum: int, spread: Spread, usable: Collection[str]) -> None:
    racks = len({spread.rack(b) for b in usable})
    raise NotEnoughBookiesError(
        f"cannot place {size} bookies with every write set of {write_quorum} in "
        f"{spread.wanted(usable, write_quorum)} racks (enforce_min_racks, "
        f"min_racks_per_write_quorum={spread.min_racks}): the writable bookies are in "
        f"{racks} rack(s)"
    )


def _score(
    slots: list[str | None], slot: int, bookie: str, write_quorum: int, spread: Spread
) -> tuple[int, int, int]:
    """How well ``bookie`` in ``slot`` spreads the write sets through it (racks, zones, and
    the racks they add up to), counting only slots already chosen."""
    size = len(slots)
    worst_racks = worst_zones = size + 1
    total = 0
    for first in range(slot - write_quorum + 1, slot + 1):
        members = [slots[(first + i) % size] for i in range(write_quorum)]
        others = [b for i, b in enumerate(members) if (first + i) % size != slot]
        racks = {spread.rack(b) for b in others if b is not None}
        racks.add(spread.rack(bookie))
        worst_racks = min(worst_racks, len(racks))
        worst_zones = min(worst_zones, len({zone_of(r) for r in racks}))
        total += len(racks)
    return worst_racks, worst_zones, total


def _quality(ensemble: Sequence[str], write_quorum: int, spread: Spread) -> tuple[int, ...]:
    racks = [spread.rack(b) for b in ensemble]
    sets = [{racks[s] for s in slots} for slots in write_sets(len(ensemble), write_quorum)]
    return (
        min(len(r) for r in sets),
        min(len({zone_of(x) for x in r}) for r in sets),
        sum(len(r) for r in sets),
    )


def _repair(
    ensemble: list[str], spare: Sequence[str], write_quorum: int, spread: Spread
) -> list[str]:
    """``ensemble`` with slots swapped, or replaced by ``spare`` bookies, while that raises its
    quality. Deterministic, and bounded: each step raises a quality that has a maximum."""
    best = _quality(ensemble, write_quorum, spread)
    spare = list(spare)
    improved = True
    while improved:
        improved = False
        size = len(ensemble)
        moves = [(i, j) for i in range(size) for j in range(i + 1, size)]
        moves += [(i, size + k) for i in range(size) for k in range(len(spare))]
        for i, j in moves:
            trial = list(ensemble)
            if j < size:
                trial[i], trial[j] = trial[j], trial[i]
            else:
                trial[i] = spare[j - size]
            quality = _quality(trial, write_quorum, spread)
            if quality > best:
                if j >= size:
                    spare[j - size] = ensemble[i]
                ensemble, best, improved = trial, quality, True
                break
    return ensemble


def _best(
    usable: Sequence[str],
    slots: list[str | None],
    slot: int,
    write_quorum: int,
    spread: Spread,
    rng: random.Random,
) -> str:
    left: dict[str, int] = {}
    for bookie in usable:
        left[spread.rack(bookie)] = left.get(spread.rack(bookie), 0) + 1
    scored = {
        b: (*_score(slots, slot, b, write_quorum, spread), left[spread.rack(b)]) for b in usable
    }
    top = max(scored.values())
    return rng.choice(sorted(b for b, score in scored.items() if score == top))


def choose_ensemble(
    candidates: Sequence[str],
    size: int,
    exclude: Collection[str],
    rng: random.Random,
    *,
    write_quorum: int | None = None,
    spread: Spread | None = None,
) -> list[str]:
    """``size`` distinct bookies from ``candidates`` not in ``exclude``, in random order; with
    ``spread``, each write set of ``write_quorum`` (default: the whole ensemble) over racks."""
    usable = sorted(set(candidates) - set(exclude))
    if len(usable) < size:
        raise NotEnoughBookiesError(
            f"need {size} writable bookies, have {len(usable)}"
            + (f" (excluding {len(set(exclude))} known bad or in use)" if exclude else "")
        )
    quorum = min(write_quorum or size, size)
    if spread is None or len({spread.rack(b) for b in usable}) < 2:
        if spread is not None and spread.enforce and spread.wanted(usable, quorum) > 1:
            _refuse(size, quorum, spread, usable)
        return rng.sample(usable, size)
    slots: list[str | None] = [None] * size
    for slot in range(size):
        chosen = _best(usable, slots, slot, quorum, spread, rng)
        slots[slot] = chosen
        usable.remove(chosen)
    ensemble = [b for b in slots if b is not None]
    if spread_of(ensemble, quorum, spread)[0] < min(spread.min_racks, quorum):
        ensemble = _repair(ensemble, usable, quorum, spread)
    if spread.enforce and spread_of(ensemble, quorum, spread)[0] < spread.wanted(
        candidates, quorum
    ):
        _refuse(size, quorum, spread, candidates)
    return ensemble


def choose_replacement(
    candidates: Sequence[str],
    ensemble: Sequence[str],
    exclude: Collection[str],
    rng: random.Random,
    *,
    slot: int | None = None,
    write_quorum: int | None = None,
    spread: Spread | None = None,
) -> str:
    """One bookie to take a failed one's slot: not in the ensemble, not known bad; with
    ``spread`` and the ``slot``, the one that spreads the write sets through it best."""
    if spread is None or slot is None:
        return choose_ensemble(candidates, 1, set(ensemble) | set(exclude), rng)[0]
    usable = sorted(set(candidates) - set(ensemble) - set(exclude))
    if len({spread.rack(b) for b in usable}) < 2:
        return choose_ensemble(candidates, 1, set(ensemble) | set(exclude), rng)[0]
    quorum = min(write_quorum or len(ensemble), len(ensemble))
    slots: list[str | None] = list(ensemble)
    chosen = _best(usable, slots, slot, quorum, spread, rng)
    if spread.enforce:
        placed = [*ensemble[:slot], chosen, *ensemble[slot + 1 :]]
        if spread_of(placed, quorum, spread)[0] < spread.wanted(candidates, quorum):
            _refuse(len(ensemble), quorum, spread, candidates)
    return chosen


def read_order(bookies: Sequence[str], rack: str | None, spread: Spread) -> list[str]:
    """``bookies`` (a write set, in its order) with those in ``rack`` first, then those in its
    zone, then the rest, each group in write-set order (BookKeeper's read reordering); as they
    are when the reader's rack is not known."""
    if rack is None:
        return list(bookies)
    zone = zone_of(rack)

    def distance(bookie: str) -> int:
        theirs = spread.rack(bookie)
        return 0 if theirs == rack else 1 if zone_of(theirs) == zone else 2

    return sorted(bookies, key=distance)


__all__ = [
    "Spread",
    "choose_ensemble",
    "choose_replacement",
    "read_order",
    "shortfall",
    "spread_of",
    "write_sets",
]
