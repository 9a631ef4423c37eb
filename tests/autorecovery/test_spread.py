"""The placement check's pure decisions (autorecovery.spread): which ledgers are marked for their
placement, which slot moves and to which bookies, that a ledger too few racks can spread is
never marked, and that repeated moves end with every write set spread as far as the racks
allow; and the mark format a release reads (a placement mark names no bookie)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aiobk.autorecovery.fragments import FragmentRange, closed_fragments, replace_bookie
from aiobk.autorecovery.spread import (
    cluster_spread,
    fragment_move,
    misplaced,
    next_move,
    score,
    short_sets,
)
from aiobk.client.placement import Spread, spread_of
from aiobk.metadata import PLACEMENT, BookieServiceInfo, Fragment, LedgerMetadata, UnderReplication
from aiobk.metadata.autorecovery import AutoRecoveryConfig
from aiobk.metadata.records import READ_ONLY

RACKS = {
    "a1:1": "/z/a",
    "a2:1": "/z/a",
    "a3:1": "/z/a",
    "b1:1": "/z/b",
    "b2:1": "/z/b",
    "c1:1": "/z/c",
    "c2:1": "/z/c",
}


def _ledger(ensemble: tuple[str, ...], wq: int = 3, last: int | None = 9) -> LedgerMetadata:
    metadata = LedgerMetadata(len(ensemble), wq, min(2, wq), (Fragment(0, ensemble),))
    return metadata if last is None else metadata.closed(last, 0)


def test_a_ledger_on_one_rack_moves_a_duplicated_slot_to_the_other_racks() -> None:
    spread = Spread(RACKS, 2)
    metadata = _ledger(("a1:1", "a2:1", "a3:1"))
    move = next_move(metadata, spread, RACKS)
    assert move is not None
    assert move.slot == 2  # the last slot of the crowded rack
    assert set(move.targets) == {"b1:1", "b2:1", "c1:1", "c2:1"}
    assert misplaced(metadata, spread, RACKS)


def test_a_spread_ledger_is_left_alone() -> None:
    spread = Spread(RACKS, 2)
    assert next_move(_ledger(("a1:1", "a2:1", "b1:1")), spread, RACKS) is None
    assert not misplaced(_ledger(("a1:1", "b1:1", "c1:1")), spread, RACKS)


def test_too_few_writable_racks_is_never_marked() -> None:
    """Every writable bookie outside the ensemble is in the ensemble's rack: no move helps,
    so the auditor does not mark it and a worker with such a mark finds nothing to move."""
    spread = Spread(RACKS, 2)
    metadata = _ledger(("a1:1", "a2:1", "a3:1"))
    assert not misplaced(metadata, spread, {"a1:1", "a2:1", "a3:1"})
    assert next_move(metadata, spread, {"a1:1", "a2:1", "a3:1"}) is None
    # Min racks 1: the check is off.
    assert not misplaced(metadata, Spread(RACKS, 1), RACKS)


def test_a_fragment_naming_an_unregistered_bookie_is_the_lost_bookie_repairs() -> None:
    spread = Spread({k: v for k, v in RACKS.items() if k != "a3:1"}, 2)
    assert next_move(_ledger(("a1:1", "a2:1", "a3:1")), spread, RACKS) is None


def test_the_writers_fragment_of_an_open_ledger_is_left_to_the_writer() -> None:
    spread = Spread(RACKS, 2)
    assert next_move(_ledger(("a1:1", "a2:1", "a3:1"), last=None), spread, RACKS) is None
    two = LedgerMetadata(
        3, 3, 2, (Fragment(0, ("a1:1", "a2:1", "a3:1")), Fragment(5, ("a1:1", "b1:1", "c1:1")))
    )
    move = next_move(two, spread, RACKS)
    assert move is not None
    assert move.fragment.index == 0
    assert move.fragment.last == 4


def test_a_move_never_narrows_another_write_set_of_a_striped_ensemble() -> None:
    racks = {**RACKS, "b3:1": "/z/b"}
    spread = Spread(racks, 2)
    ensemble = ("a1:1", "a2:1", "b1:1", "b2:1")  # E=4, WQ=2: sets (a,a) (a,b) (b,b) (b,a)
    assert len(short_sets(ensemble, 2, spread)) == 2
    fragment = FragmentRange(0, 0, 9, ensemble)
    move = fragment_move(fragment, 2, spread, racks)
    assert move is not None
    for target in move.targets:
        moved = (*ensemble[: move.slot], target, *ensemble[move.slot + 1 :])
        assert score(moved, 2, spread) > score(ensemble, 2, spread)


def test_cluster_spread_takes_every_registered_bookies_rack() -> None:
    infos = [
        BookieServiceInfo("a1:1", "127.0.0.1:1", rack="/z/a"),
        BookieServiceInfo("b1:1", "127.0.0.1:2", READ_ONLY, rack="/z/b"),
    ]
    spread = cluster_spread(infos, AutoRecoveryConfig().min_racks_per_write_quorum)
    assert spread.racks == {"a1:1": "/z/a", "b1:1": "/z/b"}
    assert spread.min_racks == 2
    assert not spread.enforce


bookie_ids = st.sampled_from(sorted(RACKS))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 5).flatmap(
        lambda e: st.tuples(
            st.lists(bookie_ids, min_size=e, max_size=e, unique=True), st.integers(2, e)
        )
    ),
    st.sets(bookie_ids, min_size=0),
)
def test_moves_end_spread_as_far_as_the_racks_allow(
    shape: tuple[list[str], int], writable: set[str]
) -> None:
    """Taking any offered target each time, moves stop after a bounded number, and then no
    write set is left short that a writable bookie of a missing rack could spread; no move
    narrows the ledger."""
    ensemble, wq = shape
    spread = Spread(RACKS, 2)
    metadata = _ledger(tuple(ensemble), wq)
    for _step in range(3 * len(ensemble)):
        move = next_move(metadata, spread, writable)
        if move is None:
            break
        target = move.targets[0]
        assert target in writable
        assert target not in move.fragment.ensemble
        changed = replace_bookie(metadata, move.fragment, move.slot, target)
        assert changed is not None
        metadata = changed
    else:
        raise AssertionError("moves did not end")
    final = closed_fragments(metadata)[0].ensemble
    assert score(final, wq, spread) >= score(tuple(ensemble), wq, spread)
    spare = {spread.rack(b) for b in writable - set(final)} - {spread.rack(b) for b in final}
    if wq == len(final) and spare:  # one write set: a bookie of another rack spreads it
        assert spread_of(final, wq, spread)[0] >= 2, (ensemble, final, writable)


def test_a_placement_mark_names_no_bookie_and_round_trips() -> None:
    """The format the release reads: a placement mark is a mark with no bookie named and the
    reason among its reasons (a release's worker passes it by, as a report)."""
    mark = UnderReplication(7, (), 1000, (PLACEMENT,))
    back = UnderReplication.from_json(mark.to_json())
    assert back == mark
    wider = back.widened(["a1:1"], "lost-bookie")
    assert wider.missing == ("a1:1",)
    assert wider.reasons == ("lost-bookie", PLACEMENT)
