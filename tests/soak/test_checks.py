"""The soak's judgements on made-up histories and series: each kind of violation is caught, and
a clean history or a bounded series passes."""

from __future__ import annotations

import pytest

from tests.soak.checks import check_log, judge_growth
from tests.soak.history import History

MIB = 2**20


def clean(records: int = 10, per_ledger: int = 4) -> History:
    """``records`` appended and read in order, ``per_ledger`` to a ledger (ledgers 10, 11...)."""
    history = History()
    for sequence in range(records):
        ledger, entry = 10 + sequence // per_ledger, sequence % per_ledger
        history.ack(sequence, ledger, entry)
        history.read(sequence, ledger, entry, intact=True)
    history.called = records
    return history


def test_a_clean_history_passes() -> None:
    verdict = check_log(clean())
    assert verdict.violations == []
    assert (verdict.reads, verdict.acked) == (10, 10)


def test_appends_landing_out_of_call_order_at_a_roll_are_caught() -> None:
    """The shape seen at a roll: 258 was given the new ledger's entry 0 before 256 and 257."""
    history = History()
    layout = [(s, 16, s) for s in range(256)]
    layout += [(258, 23, 0), (256, 23, 1), (257, 23, 2)]
    for sequence, ledger, entry in layout:
        history.ack(sequence, ledger, entry)
        history.read(sequence, ledger, entry, intact=True)
    history.called = 259
    verdict = check_log(history)
    assert verdict.counts == {"reordered": 2}
    assert verdict.places == 1
    assert "(258, 23:0) (256, 23:1) (257, 23:2)" in verdict.examples["reordered"][0]


def test_a_lost_acknowledged_record_is_caught() -> None:
    history = clean()
    del history.read_seq[4], history.read_ledger[4], history.read_entry[4]
    verdict = check_log(history)
    assert verdict.counts == {"lost": 1}
    assert verdict.examples["lost"] == ["4 acknowledged at 11:0"]


def test_a_record_read_twice_is_caught_and_so_is_the_reader_going_back() -> None:
    history = clean()
    history.read(3, 10, 3, intact=True)
    verdict = check_log(history)
    assert verdict.counts == {"duplicated": 1, "reader went back": 1, "reordered": 1}


def test_a_record_appended_twice_is_caught() -> None:
    """A retried append landing again, further on: a duplicate at a new position."""
    history = clean()
    history.read(3, 20, 0, intact=True)
    verdict = check_log(history)
    assert verdict.counts == {"duplicated": 1, "misplaced": 1, "reordered": 1}


def test_a_record_read_elsewhere_than_acknowledged_is_caught() -> None:
    history = clean()
    history.ack(9, 12, 7)
    assert check_log(history).counts == {"misplaced": 1}


def test_phantom_and_damaged_records_are_caught() -> None:
    history = clean()
    history.read(99, 20, 0, intact=True)
    history.read(5, 20, 1, intact=False)
    verdict = check_log(history)
    assert verdict.counts["phantom"] == 1
    assert verdict.counts["damaged"] == 1


def test_a_failed_append_may_be_in_the_log_once_in_its_place() -> None:
    history = History()
    for sequence in range(6):
        history.ack(sequence, 10, sequence)
    history.fail(6, "LogFencedError(...)")
    history.fail(7, "LogFencedError(...)")
    history.ack(8, 11, 0)
    for sequence in (0, 1, 2, 3, 4, 5, 6):
        history.read(sequence, 10, sequence, intact=True)
    history.read(8, 11, 0, intact=True)
    history.called = 9
    verdict = check_log(history)
    assert verdict.violations == []
    assert (verdict.failed, verdict.failed_present) == (2, 1)


def steady(values: list[int], seconds: float = 100.0) -> list[tuple[float, int]]:
    step = seconds / (len(values) - 1)
    return [(i * step, value) for i, value in enumerate(values)]


def test_a_flat_series_after_its_warm_up_is_not_growing() -> None:
    warm_up = [10 * MIB * i for i in range(10)]
    samples = steady(warm_up + [100 * MIB] * 30)
    growth = judge_growth("memory x", samples, 0.0, 100.0, 0.10, 12 * MIB)
    assert growth is not None
    assert growth.ok
    assert growth.growth == 0


def test_a_series_doubling_over_the_run_is_caught() -> None:
    samples = steady([100 * MIB + i * 5 * MIB // 2 for i in range(41)])
    growth = judge_growth("memory bookie0", samples, 0.0, 100.0, 0.10, 12 * MIB)
    assert growth is not None
    assert (growth.earlier_peak, growth.later_peak) == (160 * MIB, 200 * MIB)
    assert not growth.ok


def test_a_restart_resetting_a_series_is_not_growth() -> None:
    sawtooth = [50 * MIB + (i % 8) * 4 * MIB for i in range(41)]
    growth = judge_growth("memory bookie1", steady(sawtooth), 0.0, 100.0, 0.10, 12 * MIB)
    assert growth is not None
    assert growth.ok


@pytest.mark.parametrize("gap", [(50.0, 62.5), (87.5, 101.0)])
def test_a_window_without_samples_is_not_judged(gap: tuple[float, float]) -> None:
    samples = [(t, MIB) for t in range(0, 101, 5) if not gap[0] <= t < gap[1]]
    assert judge_growth("memory etcd0", samples, 0.0, 100.0, 0.15, MIB) is None
