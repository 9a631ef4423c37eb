"""The Spark source's options and its position arithmetic, without Spark or a cluster."""

from __future__ import annotations

import pytest

from aiobk.client import LogPosition
from aiobk.pipeline.options import Options, duration
from aiobk.pipeline.positions import (
    BEFORE,
    DataLossError,
    LedgerRange,
    LogView,
    checked_start,
    split_ranges,
)
from aiobk.pipeline.stream import _cut, decode_offset

URI = "etcd://127.0.0.1:2379/x"


def parse(**options: str) -> Options:
    return Options.parse({"metadata": URI, **options})


def test_every_option_is_parsed_with_its_default() -> None:
    opts = parse(log="orders")
    assert (opts.logs, opts.start, opts.end, opts.fail_on_data_loss) == (
        ("orders",), "earliest", "latest", True
    )  # fmt: skip
    assert (opts.max_records, opts.max_bytes, opts.min_records) == (None, None, None)
    assert opts.max_trigger_delay == 900.0
    assert (opts.split, opts.min_partitions) == (100_000, None)
    opts = parse(
        logs="a, b,a", startingPosition='{"a": "12:3", "b": {"ledger": 4, "entry": 0}}',
        endingPosition='{"a": "latest"}', failOnDataLoss="false", maxRecordsPerTrigger="10",
        maxBytesPerTrigger="1000", minRecordsPerTrigger="5", maxTriggerDelay="1500ms",
        minPartitions="8", split="50",
    )  # fmt: skip
    assert opts.logs == ("a", "b")
    assert opts.start_positions == {"a": LogPosition(12, 3), "b": LogPosition(4, 0)}
    assert (opts.end, opts.end_positions) == ("latest", {"a": "latest"})
    assert (opts.fail_on_data_loss, opts.max_records, opts.max_bytes) == (False, 10, 1000)
    assert (opts.min_records, opts.max_trigger_delay, opts.min_partitions) == (5, 1.5, 8)
    assert parse(logPattern="ord.*").pattern == "ord.*"
    assert parse(log="a", startingTimestamp="1700000000000").start_time == 1_700_000_000_000
    assert [duration(t, "d") for t in ("30", "30s", "2m", "1h", "0.5d")] == [
        30.0, 30.0, 120.0, 3600.0, 43200.0
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of"),
        ({"log": "a", "logPattern": "a"}, "exactly one of"),
        ({"logPattern": "("}, "no regular expression"),
        ({"log": "a", "startingPosition": "12"}, "must be earliest, latest or a JSON object"),
        ({"log": "a", "startingPosition": '{"a": "x"}'}, "log 'a': 'x' is not earliest"),
        ({"log": "a", "startingPosition": '{"a": {"ledger": -1, "entry": 0}}'}, "is not"),
        ({"log": "a", "maxRecordsPerTrigger": "0"}, "at least 1"),
        ({"log": "a", "maxBytesPerTrigger": "lots"}, "must be an integer"),
        ({"log": "a", "maxTriggerDelay": "soon"}, "must be a duration"),
        ({"log": "a", "failOnDataLoss": "maybe"}, "true or false"),
        ({"log": "a", "startingTimestamp": "1", "startingPosition": "latest"}, "not both"),
        ({"log": "a", "endingTimestamp": "1", "endingPosition": "latest"}, "not both"),
        ({"log": "a", "ledgers": "x"}, "comma-separated ledger ids"),
        ({"log": "a", "recordFormat": "zip"}, "must be raw or envelope"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(**options)
    with pytest.raises(ValueError, match=r"needs \.option\('metadata'"):
        Options.parse({"log": "a"})


def make_view(ends: dict[int, int], ledgers: tuple[int, ...] | None = None) -> LogView:
    ledgers = tuple(sorted(ends)) if ledgers is None else ledgers
    return LogView("L", ledgers, "raw", ends, {})


def test_ranges_between_two_positions() -> None:
    v = make_view({10: 99, 20: -1, 30: 49})
    assert v.latest == LogPosition(30, 50)
    got = [(r.ledger_id, r.first, r.last) for r in v.ranges(BEFORE, v.latest)]
    assert got == [(10, 0, 99), (30, 0, 49)]
    got = [
        (r.ledger_id, r.first, r.last) for r in v.ranges(LogPosition(10, 95), LogPosition(30, 3))
    ]
    assert got == [(10, 95, 99), (30, 0, 2)]
    assert v.ranges(LogPosition(30, 50), v.latest) == []
    assert v.normalised(LogPosition(10, 100)) == LogPosition(20, 0)
    assert v.normalised(LogPosition(30, 50)) == LogPosition(30, 50)  # the last: may grow
    assert make_view({}).latest == BEFORE


def test_a_start_in_truncated_ledgers_is_data_loss() -> None:
    v = make_view({30: 49}, ledgers=(30,))  # ledgers 10 and 20 were truncated away
    with pytest.raises(DataLossError, match="from 10:5 up to 30:0 were truncated away"):
        checked_start(v, LogPosition(10, 5), True)
    assert checked_start(v, LogPosition(10, 5), False) == LogPosition(30, 0)
    assert checked_start(v, BEFORE, True) == BEFORE  # earliest: nothing to lose
    with pytest.raises(DataLossError):  # 25 < the first left: a truncated ledger may be 25
        checked_start(v, LogPosition(25, 0), True)
    two = make_view({20: 9, 30: 49})
    assert checked_start(two, LogPosition(25, 0), True) == LogPosition(25, 0)  # between two
    assert checked_start(v, LogPosition(30, 7), True) == LogPosition(30, 7)
    # Consumed to the end of a closed ledger, then it was truncated: no loss (normalised
    # while it was still there).
    both = make_view({10: 4, 30: 49})
    assert checked_start(both, LogPosition(10, 5), True) == LogPosition(30, 0)


def test_split_and_min_partitions() -> None:
    ranges = [LedgerRange("L", 10, 0, 999, "raw"), LedgerRange("L", 20, 0, 9, "raw")]
    assert len(split_ranges(ranges, 100_000, None)) == 2
    parts = split_ranges(ranges, 100_000, 8)
    assert len(parts) >= 8
    assert sum(p.count for p in parts) == 1010
    assert len(split_ranges(ranges, 300, None)) == 5


def test_offsets_and_cuts() -> None:
    assert decode_offset({"ledger": 5, "entry": 3}, "orders") == {"orders": LogPosition(5, 3)}
    assert decode_offset({"logs": {"a": {"ledger": 1, "entry": 2}}}, "") == {"a": LogPosition(1, 2)}
    ranges = [LedgerRange("L", 10, 95, 99, "raw"), LedgerRange("L", 30, 0, 49, "raw")]
    assert _cut(ranges, 3) == LogPosition(10, 98)
    assert _cut(ranges, 5) == LogPosition(30, 0)
    assert _cut(ranges, 54) == LogPosition(30, 49)
    assert _cut(ranges, 55) is None
