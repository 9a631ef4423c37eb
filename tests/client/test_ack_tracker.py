"""The ack tracker (``client.ack_tracker``): pure, no sockets, no event loop."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from aiobk.client.ack_tracker import AckTracker
from aiobk.client.quorum import write_set


@dataclass(eq=False)
class Entry:
    entry_id: int
    length: int
    acks: int = 0
    done: bool = False


def _tracker(e: int = 3, wq: int = 3, aq: int = 2, **kw: object) -> AckTracker[Entry]:
    tracker: AckTracker[Entry] = AckTracker(e, wq, aq, **kw)  # type: ignore[arg-type]
    return tracker


def _track(tracker: AckTracker[Entry], count: int, first: int = 0) -> list[Entry]:
    entries = [Entry(first + i, 10 * (first + i + 1)) for i in range(count)]
    for entry in entries:
        tracker.track(entry)
    return entries


def _completed(tracker: AckTracker[Entry], count: int) -> list[Entry]:
    """``count`` entries acknowledged by slots 0 and 1, and completed."""
    entries = _track(tracker, count)
    for entry in entries:
        tracker.ack(entry, 0)
        tracker.ack(entry, 1)
    assert tracker.pop_ready() == entries
    return entries


def test_an_entry_completes_at_its_ack_quorum_and_only_after_those_before_it() -> None:
    tracker = _tracker()
    first, second = _track(tracker, 2)
    assert not tracker.ack(second, 0)
    assert not tracker.ack(second, 1)  # has its quorum, but entry 0 has not
    assert tracker.pop_ready() == []
    assert not tracker.ack(first, 2)
    assert tracker.ack(first, 0)  # the head reached its quorum
    assert tracker.pop_ready() == [first, second]
    assert first.done
    assert second.done
    assert (tracker.lac, tracker.lac_length, tracker.last_acked) == (1, 20, 1)


def test_a_replaced_slot_s_acks_no_longer_count() -> None:
    tracker = _tracker()
    (entry,) = _track(tracker, 1)
    tracker.ack(entry, 0)
    tracker.forget_slots([0])
    assert not tracker.ack(entry, 1)  # one ack left: below the quorum of two
    assert tracker.ack(entry, 2)
    assert tracker.pop_ready() == [entry]


def test_volatile_lac_follows_last_add_synced_never_past_what_completed() -> None:
    """BP-14: the LAC is what WQ - AQ + 1 slots have synced, capped by completion."""
    tracker = _tracker(volatile=True)
    _completed(tracker, 3)
    assert (tracker.last_acked, tracker.lac) == (2, -1)  # written, nothing synced yet
    assert not tracker.synced_to(0, 2)  # one slot is not enough (WQ - AQ + 1 = 2)
    assert tracker.synced_to(1, 1)
    assert (tracker.lac, tracker.lac_length) == (1, 20)
    assert tracker.synced_to(2, 5)  # reports beyond what completed count only up to it
    assert tracker.lac == 2
    assert not tracker.synced_to(2, 4)  # never backwards
    assert tracker.advance_volatile_lac(ceiling=1) == 2


def test_volatile_lac_steps_keep_lengths_only_above_it() -> None:
    """Completed volatile entries keep their lengths until the LAC passes them: each step of
    the LAC gives its entry's length, and what it passed is forgotten (from the front, in
    entry order -- a sync behind 1,000 completed entries costs the entries it passes)."""
    tracker = _tracker(volatile=True)
    entries = _completed(tracker, 1_000)
    for step in (0, 1, 7, 500, 501, 998, 999):
        tracker.synced_to(0, step)
        assert tracker.synced_to(1, step)
        assert (tracker.lac, tracker.lac_length) == (step, entries[step].length)
        assert list(tracker._lengths) == [e.entry_id for e in entries[step + 1 :]]


def test_drain_hands_back_everything_in_flight() -> None:
    tracker = _tracker()
    entries = _track(tracker, 3)
    assert list(tracker.drain()) == entries
    assert all(entry.done for entry in entries)
    assert tracker.pending == type(tracker.pending)()


def _model(acks_per_entry: list[int], aq: int) -> tuple[int, int]:
    """Reference: the LAC is the end of the longest prefix of entries with AQ acks each."""
    done = 0
    while done < len(acks_per_entry) and acks_per_entry[done] >= aq:
        done += 1
    return done - 1, done


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=5).flatmap(
        lambda e: st.tuples(
            st.just(e),
            st.integers(min_value=1, max_value=e).flatmap(
                lambda wq: st.tuples(st.just(wq), st.integers(min_value=1, max_value=wq))
            ),
        )
    ),
    st.integers(min_value=1, max_value=12),
    st.randoms(use_true_random=False),
)
def test_any_ack_order_gives_the_reference_completion_order_and_lac(
    shape: tuple[int, tuple[int, int]], count: int, rng: object
) -> None:
    """Acks arrive in any order, some never: completions are always a prefix of the entries,
    in order, and the LAC is the end of the longest fully acknowledged prefix."""
    import random

    assert isinstance(rng, random.Random)
    e, (wq, aq) = shape
    tracker = _tracker(e, wq, aq)
    entries = _track(tracker, count)
    deliveries = [(entry, slot) for entry in entries for slot in write_set(entry.entry_id, e, wq)]
    rng.shuffle(deliveries)
    deliveries = deliveries[: rng.randint(0, len(deliveries))]  # the rest never arrive
    completed: list[Entry] = []
    acks = [0] * count
    for entry, slot in deliveries:
        acks[entry.entry_id] += 1
        if tracker.ack(entry, slot):
            completed += tracker.pop_ready()
        assert completed == entries[: len(completed)]  # in order, from the first
    lac, done = _model(acks, aq)
    assert completed == entries[:done]
    assert tracker.lac == lac
    assert tracker.last_acked == lac
    assert len(tracker.pending) == count - done
