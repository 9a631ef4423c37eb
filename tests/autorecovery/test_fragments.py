"""The pure part of autorecovery (autorecovery.fragments): which entries a slot owes, which
fragments are closed, what a check asks, and the ensemble swap that refuses a changed ledger."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from aiobk.autorecovery.fragments import (
    FragmentRange,
    bookies_named,
    check_points,
    closed_fragments,
    nth_owed,
    open_fragment,
    owed_count,
    replace_bookie,
    slot_bounds,
    slot_entries,
)
from aiobk.metadata import Fragment, LedgerMetadata, write_set

A, B, C, D, E, F = "a:1", "b:1", "c:1", "d:1", "e:1", "f:1"


def _ledger(fragments: tuple[Fragment, ...], last: int | None) -> LedgerMetadata:
    metadata = LedgerMetadata(3, 3, 2, fragments)
    return metadata if last is None else metadata.closed(last, 0)


shapes = st.integers(1, 6).flatmap(
    lambda e: st.tuples(st.just(e), st.integers(1, e), st.integers(0, e - 1))
)


@given(shapes, st.integers(0, 60), st.integers(-1, 60))
def test_slot_entries_are_exactly_those_whose_write_set_names_the_slot(
    shape: tuple[int, int, int], first: int, span: int
) -> None:
    e, wq, slot = shape
    last = first + span
    expected = [x for x in range(first, last + 1) if slot in write_set(x, e, wq)]
    assert list(slot_entries(first, last, slot, e, wq)) == expected
    bounds = slot_bounds(first, last, slot, e, wq)
    assert bounds == ((expected[0], expected[-1]) if expected else None)


@given(shapes, st.integers(0, 40), st.integers(0, 200), st.floats(0, 100), st.integers(0, 9))
def test_check_points_are_owed_entries_including_both_ends(
    shape: tuple[int, int, int], first: int, span: int, percentage: float, seed: int
) -> None:
    e, wq, slot = shape
    ensemble = tuple(f"b{i}:1" for i in range(e))
    metadata = LedgerMetadata(e, wq, 1, (Fragment(0, ensemble),))
    fragment = FragmentRange(0, first, first + span, ensemble)
    points = check_points(fragment, slot, metadata, percentage, random.Random(seed))
    owed = list(slot_entries(first, first + span, slot, e, wq))
    assert set(points) <= set(owed)
    if owed:
        assert owed[0] in points
        assert owed[-1] in points
    else:
        assert points == []
    assert len(points) == len(set(points))
    if percentage == 100:
        assert points == owed  # every entry, none twice (a random pick per bucket missed some)
    else:
        assert len(points) >= min(len(owed), int(len(owed) * percentage / 100))


@given(shapes, st.integers(0, 80), st.integers(-1, 80))
def test_owed_entries_are_counted_and_indexed_without_walking_them(
    shape: tuple[int, int, int], first: int, span: int
) -> None:
    e, wq, slot = shape
    owed = list(slot_entries(first, first + span, slot, e, wq))
    assert owed_count(first, first + span, slot, e, wq) == len(owed)
    assert [nth_owed(first, slot, e, wq, i) for i in range(len(owed))] == owed


def test_closed_fragments_of_an_open_and_a_closed_ledger() -> None:
    fragments = (Fragment(0, (A, B, C)), Fragment(10, (A, B, D)), Fragment(25, (E, B, D)))
    open_ledger = _ledger(fragments, None)
    assert [(r.first, r.last) for r in closed_fragments(open_ledger)] == [(0, 9), (10, 24)]
    assert open_fragment(open_ledger) == fragments[-1]
    closed = _ledger(fragments, 30)
    assert [(r.first, r.last) for r in closed_fragments(closed)] == [(0, 9), (10, 24), (25, 30)]
    assert open_fragment(closed) is None
    assert bookies_named(closed) == {A, B, C, D, E}


def test_a_fragment_past_the_last_entry_holds_nothing() -> None:
    """A writer changed its ensemble at entry 10, then recovery found 8 the last entry: the
    fragments from 10 on are empty, not owed entries that never existed."""
    fragments = (Fragment(0, (A, B, C)), Fragment(10, (A, B, D)), Fragment(12, (A, E, D)))
    ranges = closed_fragments(_ledger(fragments, 8))
    assert [(r.first, r.last, r.empty) for r in ranges] == [
        (0, 8, False),
        (10, 8, True),
        (12, 8, True),
    ]


def test_replace_bookie_swaps_one_slot_of_one_fragment() -> None:
    fragments = (Fragment(0, (A, B, C)), Fragment(10, (A, B, D)))
    metadata = _ledger(fragments, 20)
    first = closed_fragments(metadata)[0]
    swapped = replace_bookie(metadata, first, 2, F)
    assert swapped is not None
    assert swapped.fragments == (Fragment(0, (A, B, F)), Fragment(10, (A, B, D)))
    assert (swapped.state, swapped.last_entry_id) == (metadata.state, metadata.last_entry_id)


def test_replace_bookie_refuses_a_fragment_changed_since_it_was_read() -> None:
    fragments = (Fragment(0, (A, B, C)), Fragment(10, (A, B, D)))
    read = _ledger(fragments, None)
    stale = closed_fragments(read)[0]
    # Someone else swapped C already.
    other = replace_bookie(read, stale, 2, E)
    assert other is not None
    assert replace_bookie(other, stale, 2, F) is None
    # The writer's fragment is not closed: never swapped.
    assert replace_bookie(read, FragmentRange(1, 10, 20, (A, B, D)), 0, F) is None
    # The ledger was closed short of the range the copy was made for.
    assert replace_bookie(read.closed(5, 0), stale, 2, F) is None
