"""BP-14's sync cursor (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiobk.bookie.sync_cursor import SyncCursor


def test_in_order_out_of_order_and_lac() -> None:
    cursor = SyncCursor()
    assert cursor.synced(0) == 0
    assert cursor.synced(2) == 0  # a gap at 1
    assert cursor.synced(4) == 0
    assert cursor.ranges == [[2, 2], [4, 4]]
    assert cursor.synced(3) == 0
    assert cursor.ranges == [[2, 4]]
    assert cursor.synced(1) == 4  # the gap closes: the cursor swallows the range
    assert cursor.ranges == []
    assert cursor.synced(7) == 4
    assert cursor.confirmed(5) == 5  # a piggybacked LAC moves it past the unsynced 5
    assert cursor.synced(6) == 7
    assert cursor.confirmed(3) == 7  # never backwards


@given(st.lists(st.integers(0, 40), max_size=60), st.integers(-1, 45))
def test_cursor_is_the_contiguous_prefix(order: list[int], lac: int) -> None:
    cursor = SyncCursor()
    for entry in order:
        cursor.synced(entry)
    cursor.confirmed(lac)
    done = set(order) | set(range(lac + 1))
    expected = -1
    while expected + 1 in done:
        expected += 1
    assert cursor.last_add_synced == expected
    for first, last in cursor.ranges:
        assert first > expected + 1
        assert all(e in done for e in range(first, last + 1))
