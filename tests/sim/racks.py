"""The racks profile's check of placement after repair: once autorecovery has nothing left to
do, every write set holding an entry spans as many racks as the bookies left allow (up to
``min_racks_per_write_quorum``), so copies that a rack's loss moved are spread again and the
next rack lost takes no entry whole.

The profile itself is spread over the simulator: nine bookies in three racks of three
(``run.SCALES["racks"]``, ``World(racks=...)``), a plan that loses one whole rack at one virtual
instant (``loss.LossPlan.rack``), and the tooth (``Switches.spread_over_racks``: placement at
random, an entry's every copy in one rack).

A replacement chosen slot by slot cannot always spread a ledger's write sets; the auditor's
placement marks and the workers' moves do (autorecovery/spread.py), and this check holds them
to it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from aiobk.autorecovery.fragments import closed_fragments
from aiobk.client.placement import Spread, write_sets
from aiobk.metadata import LedgerMetadata
from tests.sim.history import History
from tests.sim.world import World

MIN_RACKS = 2  # ClientConfig.min_racks_per_write_quorum as the simulator's clients have it


def best_spread(size: int, write_quorum: int, room: Mapping[str, int], wanted: int) -> int:
    """The most racks, up to ``wanted``, that every write set of an ensemble of ``size`` can
    span, with ``room[rack]`` bookies to choose from in each rack (tried exhaustively: the
    simulator's ensembles are small)."""
    racks = sorted(rack for rack, count in room.items() if count > 0)
    best = 0
    for labels in itertools.product(racks, repeat=size):
        if any(labels.count(rack) > room[rack] for rack in set(labels)):
            continue
        worst = min(len({labels[s] for s in slots}) for slots in write_sets(size, write_quorum))
        best = max(best, min(worst, wanted))
        if best == wanted:
            break
    return best


def short_of_racks(
    ledger_id: int, metadata: LedgerMetadata, racks: Mapping[str, str], alive: Sequence[str]
) -> list[str]:
    """Each write set of ``metadata`` holding entries that spans fewer racks than ``alive``
    bookies (each in its rack of ``racks``) allow."""
    spread = Spread(dict(racks), MIN_RACKS)
    room: dict[str, int] = {}
    for bookie in alive:
        room[spread.rack(bookie)] = room.get(spread.rack(bookie), 0) + 1
    size, quorum = metadata.ensemble_size, min(metadata.write_quorum, metadata.ensemble_size)
    wanted = best_spread(size, quorum, room, min(MIN_RACKS, quorum))
    sets = write_sets(size, quorum)
    found = []
    for fragment in closed_fragments(metadata):
        used = {entry % size for entry in range(fragment.first, fragment.last + 1)}
        seen: set[frozenset[int]] = set()  # E = WQ: every entry's write set is the one ensemble
        for first in sorted(used):
            if frozenset(sets[first]) in seen:
                continue
            seen.add(frozenset(sets[first]))
            members = [fragment.ensemble[s] for s in sets[first]]
            spans = len({spread.rack(b) for b in members})
            if spans < wanted:
                found.append(
                    f"I15 ledger {ledger_id} not spread again: the fragment from entry "
                    f"{fragment.first} writes on {members}, in {spans} rack(s); the bookies "
                    f"left allow {wanted}"
                )
    return found


async def check_spread_again(world: World, history: History) -> None:
    """``short_of_racks`` for every ledger the store holds, on the bookies not lost."""
    racks = world.racks
    alive = [sim.bookie_id for sim in world.bookies.values() if not sim.lost_forever]
    async for ledger_id, metadata in world.store().scan_ledgers():
        if metadata is not None:
            history.violations.extend(short_of_racks(ledger_id, metadata, racks, alive))
