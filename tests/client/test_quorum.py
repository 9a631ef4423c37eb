"""Quorum math and recovery decisions with the BookKeeper documents' own examples (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiobk.client.quorum import (
    coverage_impossible,
    covered,
    ensemble_coverage,
    lac_from_last_add_synced,
    quorum_coverage,
    write_set,
)
from aiobk.client.recovery_decisions import FenceTracker, Outcome, ReadTracker


def test_write_sets_from_protocol_md() -> None:
    # E=4, WQ=3: entry 0 -> B1,B2,B3; entry 1 -> B2,B3,B4; entry 2 -> B3,B4,B1.
    assert write_set(0, 4, 3) == [0, 1, 2]
    assert write_set(1, 4, 3) == [1, 2, 3]
    assert write_set(2, 4, 3) == [2, 3, 0]
    assert write_set(5, 4, 3) == [1, 2, 3]
    assert {tuple(write_set(e, 4, 3)) for e in range(100)} == {
        tuple(write_set(e, 4, 3)) for e in range(4)
    }  # as many distinct write quorums as bookies
    assert {tuple(write_set(e, 3, 3)) for e in range(10)} == {(0, 1, 2), (1, 2, 0), (2, 0, 1)}


def test_coverage_thresholds() -> None:
    assert quorum_coverage(3, 2) == 2
    assert ensemble_coverage(3, 2) == 2
    assert ensemble_coverage(5, 2) == 4
    assert quorum_coverage(3, 3) == 1
    assert quorum_coverage(3, 1) == 3


@given(
    st.integers(1, 6)
    .flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e)))
    .flatmap(lambda ew: st.tuples(st.just(ew[0]), st.just(ew[1]), st.integers(1, ew[1]))),
    st.data(),
)
def test_coverage_means_no_ack_quorum_escapes(
    ewa: tuple[int, int, int], data: st.DataObject
) -> None:
    e, wq, aq = ewa
    slots = data.draw(st.sets(st.integers(0, e - 1)))
    # Definition: every AQ-subset of every write set contains a slot of `slots`, i.e. the
    # unfenced bookies of any write set number fewer than AQ.
    expected = all(
        sum(1 for s in write_set(start, e, wq) if s not in slots) < aq for start in range(e)
    )
    assert covered(e, wq, aq, slots) == expected
    if e == wq:  # no striping: coverage is exactly EC responses
        assert covered(e, wq, aq, slots) == (len(slots) >= ensemble_coverage(e, aq))
    failed = set(range(e)) - slots
    if not covered(e, wq, aq, slots):
        assert coverage_impossible(e, wq, aq, failed)


def test_bp14_lac_examples() -> None:
    # BP-14: ensemble A, B, C with LastAddSynced 1, 2, 3.
    assert lac_from_last_add_synced([1, 2, 3], 3, 1) == 3
    assert lac_from_last_add_synced([1, 2, 3], 3, 2) == 2
    assert lac_from_last_add_synced([3, 1, 2], 3, 3) == 1


def test_fencing_completes_at_coverage_and_fails_at_ack_quorum_failures() -> None:
    tracker = FenceTracker(3, 3, 2, fragment_first_entry=0)
    assert tracker.ok(0, 5) is Outcome.PENDING
    assert tracker.ok(2, 7) is Outcome.POSITIVE  # EC = 2 of 3
    assert tracker.start_lac == 7
    failing = FenceTracker(3, 3, 2, 0)
    assert failing.fail(0) is Outcome.PENDING  # one silent bookie: still possible
    assert failing.fail(1) is Outcome.UNKNOWN  # AQ failures: no coverage possible
    striped = FenceTracker(5, 2, 2, 0)  # write sets {0,1},{1,2},{2,3},{3,4},{4,0}
    for slot in (0, 2):
        assert striped.ok(slot, -1) is Outcome.PENDING
    assert striped.ok(4, -1) is Outcome.POSITIVE  # {0,2,4} touches every write set


def test_recovery_starts_no_lower_than_the_last_fragment() -> None:
    # Trap 2: the new bookies of a later fragment answer LAC -1.
    tracker = FenceTracker(3, 3, 2, fragment_first_entry=100)
    tracker.ok(0, -1)
    tracker.ok(1, -1)
    assert tracker.start_lac == 99


def test_recovery_read_outcomes_from_reliability_md() -> None:
    def run(*answers: str) -> Outcome:
        tracker = ReadTracker(3, 2)
        outcome = Outcome.PENDING
        for answer in answers:
            outcome = getattr(tracker, answer)()
        return outcome

    assert run("negative", "negative") is Outcome.NEGATIVE  # QC=2 explicit negatives
    assert run("negative", "negative", "unknown") is Outcome.NEGATIVE  # closes
    assert run("negative", "unknown", "unknown") is Outcome.UNKNOWN  # must not close
    assert run("unknown", "positive") is Outcome.POSITIVE  # a single positive is written back
    assert run("negative", "unknown") is Outcome.PENDING
    assert ReadTracker(3, 3).negative() is Outcome.NEGATIVE  # QC=1 when AQ=WQ
