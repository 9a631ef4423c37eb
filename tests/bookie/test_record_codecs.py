"""The compiled record encoders against the pure-Python ones: the same cases through both, the
same bytes, locations, return values and errors (``aiobk.bookie.record_codecs``)."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiobk.bookie import record_codecs
from aiobk.bookie.entrylog import format as log_format
from aiobk.bookie.entrylog.format import FILE_MAGIC, OFFSET_BITS
from aiobk.bookie.journal import format as journal_format
from aiobk.protocol import batch
from aiobk.protocol.batch import MAX_BATCH_ENTRIES, pack_bodies
from aiobk.protocol.entry import ENTRY_HEADER


def compiled() -> Any:
    """The extension; a dev install builds it, so its absence fails here (no fallback)."""
    return importlib.import_module("aiobk.bookie._records")


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", call()
    except Exception as exc:  # the exception's type and text are the outcome compared
        return "error", (type(exc), str(exc))


def test_the_extension_is_built_and_chosen() -> None:
    module = compiled()
    assert record_codecs.COMPILED is (os.environ.get("AIOBK_NO_EXTENSIONS") != "1")
    if record_codecs.COMPILED:
        assert record_codecs.unpack_bodies is module.unpack_bodies
        assert record_codecs.encode_adds is module.encode_adds
        assert record_codecs.pack_records is module.pack_records
        assert record_codecs.check_records is module.check_records
        assert record_codecs.run_end is module.run_end
    else:
        assert record_codecs.unpack_bodies is batch.unpack_bodies
        assert record_codecs.encode_adds is journal_format.encode_adds
        assert record_codecs.pack_records is log_format.pack_records
        assert record_codecs.check_records is log_format.check_records
        assert record_codecs.run_end is log_format.run_end


def test_no_extensions_chooses_the_pure_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOBK_NO_EXTENSIONS", "1")
    try:
        pure = importlib.reload(record_codecs)
        assert not pure.COMPILED
        assert pure.unpack_bodies is batch.unpack_bodies
        assert pure.encode_adds is journal_format.encode_adds
        assert pure.pack_records is log_format.pack_records
        assert pure.check_records is log_format.check_records
        assert pure.run_end is log_format.run_end
    finally:
        monkeypatch.delenv("AIOBK_NO_EXTENSIONS")
        importlib.reload(record_codecs)


@settings(max_examples=300)
@given(st.binary(max_size=2000), st.integers(0, 2**32 - 1))
def test_crc32c_is_the_crc32c_packages(data: bytes, value: int) -> None:
    module = compiled()
    expected = crc32c.crc32c(data, value)
    assert module.crc32c(data, value) == expected
    assert module.crc32c(data, value, True) == expected  # the table, on any CPU


def as_view(body: bytes) -> memoryview:
    return memoryview(body)


IDS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**40),
    st.sampled_from([-(2**63) - 1, 2**63, 2**64, True]),
)
BODY = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=40).map(bytearray),
    st.binary(max_size=40).map(as_view),
)
PAIR = st.one_of(
    st.tuples(IDS, BODY),
    st.tuples(st.integers(0, 2**62), st.binary(max_size=300)),
    st.builds(lambda e, b: [e, b], st.integers(0, 100), st.binary(max_size=20)),
    st.just(("x", b"")),
    st.just((1,)),
)
KINDS = st.sampled_from([list, tuple, iter])  # iter: neither, so both take the pure path


@settings(max_examples=400)
@given(
    st.one_of(st.integers(0, 2**40), st.sampled_from([-1, 2**63 - 3, 2**64 - 2, 2**64])),
    st.one_of(IDS, st.just(3)),
    st.lists(PAIR, max_size=12),
    KINDS,
)
def test_encode_adds_agrees(
    first_lsn: int, ledger_id: int, entries: list[Any], kind: Callable[[list[Any]], Any]
) -> None:
    pure = outcome(lambda: journal_format.encode_adds(first_lsn, ledger_id, kind(entries)))
    fast = outcome(lambda: compiled().encode_adds(first_lsn, ledger_id, kind(entries)))
    assert fast == pure


@settings(max_examples=400)
@given(
    st.binary(max_size=200),
    st.one_of(st.integers(0, 10_000), st.just(-5)),
    st.integers(0, 20_000),
    st.one_of(st.integers(0, 2**20).map(lambda log_id: log_id << OFFSET_BITS), st.just(-1)),
    st.one_of(st.integers(0, 2**62), IDS),
    st.lists(PAIR, max_size=12),
    st.integers(0, 14),
    st.booleans(),
)
def test_pack_records_agrees(
    prefix: bytes,
    start: int,
    max_size: int,
    location_base: int,
    ledger_id: int,
    entries: list[Any],
    first: int,
    as_tuple: bool,
) -> None:
    """Records appended, locations, where it stopped (a log's size limit) and any error."""
    first = min(first, len(entries))
    given_entries = tuple(entries) if as_tuple else entries
    results = []
    for pack in (log_format.pack_records, compiled().pack_records):
        data, locations = bytearray(prefix), [7]
        args = (data, start, max_size, location_base, ledger_id, given_entries, first, locations)
        result = outcome(functools.partial(pack, *args))
        results.append((result, bytes(data), locations))
    assert results[0] == results[1]


def test_pack_records_stops_at_the_size_limit_but_a_log_takes_its_first_record() -> None:
    body = bytes(range(100))
    entries = [(entry_id, body) for entry_id in range(5)]
    for pack in (log_format.pack_records, compiled().pack_records):
        data, locations = bytearray(FILE_MAGIC), list[int]()
        assert pack(data, 0, 12 + 2 * 124, 1 << OFFSET_BITS, 9, entries, 0, locations) == 2
        assert locations == [1 << OFFSET_BITS | 12, 1 << OFFSET_BITS | 136]
        fresh, locations = bytearray(FILE_MAGIC), list[int]()
        assert pack(fresh, 0, 50, 0, 9, entries, 3, locations) == 4  # too big, but first
        assert locations == [12]


def body_of(header: tuple[int, int, int, int, int, int], tail: bytes) -> bytes:
    return ENTRY_HEADER.pack(*header) + tail


VALID_BODY = st.tuples(
    st.sampled_from([0, 1, 2]),  # digest type
    st.integers(-(2**63), 2**63 - 1),  # piggybacked LAC
    st.integers(-(2**63), 2**63 - 1),  # length
    st.binary(min_size=32, max_size=60),  # digest and payload: long enough for any digest
)


@settings(max_examples=500)
@given(
    st.lists(VALID_BODY, max_size=8),
    st.lists(st.integers(1, 2**20), min_size=8, max_size=8),  # id steps: increasing ids
    st.one_of(st.none(), st.integers(0, 600)),  # a byte to change
    st.integers(1, 255),  # changed by
    st.one_of(st.just(b""), st.binary(min_size=1, max_size=6)),  # trailing bytes
    st.one_of(st.none(), st.integers(0, 600)),  # cut short at
    st.sampled_from([5, 5, 5, 6, 2**63, -(2**63) - 1]),  # the ledger asked for
    st.sampled_from([bytes, bytes, bytearray]),
)
def test_unpack_bodies_agrees(
    bodies: list[tuple[int, int, int, bytes]],
    steps: list[int],
    flip: int | None,
    by: int,
    trailing: bytes,
    cut: int | None,
    ledger_id: int,
    kind: Callable[[bytes], Any],
) -> None:
    """Every check a batch goes through -- lengths, header, ledger, ids increasing, count --
    ends the same way in both: the same entries, or the same ``BatchError``. Batches start
    valid (entries of ledger 5, ids increasing), then may have a byte changed, bytes added
    or be cut short."""
    entry_id = -1
    parts = []
    for (digest, lac, length, tail), step in zip(bodies, steps, strict=False):
        entry_id += step
        parts.append(body_of((1, digest, 5, entry_id, lac, length), tail))
    packed = bytearray(pack_bodies(parts) + trailing)
    if flip is not None and flip < len(packed):
        packed[flip] = (packed[flip] + by) % 256
    if cut is not None:
        del packed[cut:]
    given_bytes = kind(bytes(packed))
    pure = outcome(lambda: batch.unpack_bodies(given_bytes, ledger_id))
    fast = outcome(lambda: compiled().unpack_bodies(given_bytes, ledger_id))
    assert fast == pure


def test_unpack_bodies_refuses_more_than_a_batch_holds_as_the_pure_one_does() -> None:
    body = body_of((1, 0, 5, 0, -1, 0), b"")
    for count, ok in ((MAX_BATCH_ENTRIES, True), (MAX_BATCH_ENTRIES + 1, False)):
        packed = pack_bodies(
            [body_of((1, 0, 5, entry_id, -1, 0), b"x") for entry_id in range(count)]
        )
        pure = outcome(functools.partial(batch.unpack_bodies, packed, 5))
        assert outcome(functools.partial(compiled().unpack_bodies, packed, 5)) == pure
        assert (pure[0] == "value") is ok
    assert outcome(lambda: compiled().unpack_bodies(body, 5))[0] == "error"  # no length


@settings(max_examples=400)
@given(
    st.lists(st.tuples(st.booleans(), st.binary(max_size=120)), min_size=1, max_size=12),
    st.integers(0, 2**20),
    st.one_of(st.none(), st.tuples(st.integers(0, 10**5), st.integers(1, 255))),
    st.integers(0, 200),
    st.sampled_from(["whole", "cut", "shifted", "bytearray", "tuple", "other ids"]),
)
def test_check_records_agrees(
    records: list[tuple[bool, bytes]],
    log_id: int,
    damage: tuple[int, int] | None,
    cut: int,
    shape: str,
) -> None:
    """A range read's run: the bodies when every record is whole and sound, else None, the
    same from both; and a run both take gives the bodies written."""
    ledger_id, other = 9, 10
    data, locations = bytearray(FILE_MAGIC), list[int]()
    mine: list[tuple[int, bytes]] = []
    for entry_id, (ours, body) in enumerate(records):  # the ledger's records and another's
        log_format.pack_records(
            data, 0, 2**40, log_id << OFFSET_BITS, ledger_id if ours else other,
            [(entry_id, body)], 0, locations,
        )  # fmt: skip
        if ours:
            mine.append((entry_id, body))
    run: Any = [
        (entry_id, location)
        for (entry_id, (ours, _body)), location in zip(enumerate(records), locations, strict=True)
        if ours
    ]
    if not run:
        return
    start = run[0][1] & ((1 << OFFSET_BITS) - 1)
    block: Any = bytes(data[start:])
    if damage is not None:
        flipped = bytearray(block)
        flipped[damage[0] % len(flipped)] ^= damage[1]
        block = bytes(flipped)
    if shape == "cut":
        block = block[: max(0, len(block) - cut)]
    elif shape == "shifted":
        start += 1
    elif shape == "bytearray":
        block = bytearray(block)
    elif shape == "tuple":
        run = tuple(run)
    elif shape == "other ids":
        run = [(entry_id + 1, location) for entry_id, location in run]
    pure = outcome(lambda: log_format.check_records(block, start, ledger_id, run))
    fast = outcome(lambda: compiled().check_records(block, start, ledger_id, run))
    assert fast == pure
    if damage is None and shape in ("whole", "bytearray", "tuple"):
        assert pure == ("value", [body for entry_id, body in mine])


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 2**20), st.integers(-1, 2**62)), max_size=12
    ),
    st.integers(0, 11),
    st.integers(0, 2**21),
    st.booleans(),
)
def test_run_end_agrees(wanted: list[tuple[int, int, int]], at: int, limit: int, odd: bool) -> None:
    pairs: Any = [
        (entry_id, (log_id << OFFSET_BITS) | offset) for log_id, offset, entry_id in wanted
    ]
    if odd and pairs:  # a location as no index gives one: the pure function decides
        pairs[-1] = (pairs[-1][0], str(pairs[-1][1]))
    pure = outcome(lambda: log_format.run_end(pairs, at, limit))
    fast = outcome(lambda: compiled().run_end(pairs, at, limit))
    assert fast == pure


def test_run_end_takes_the_records_of_one_log_in_file_order_before_the_limit() -> None:
    log = 3 << OFFSET_BITS
    wanted = [(0, log | 100), (1, log | 200), (2, log | 300), (3, (4 << OFFSET_BITS) | 400)]
    for run_end in (log_format.run_end, compiled().run_end):
        assert run_end(wanted, 0, 10**6) == 3  # the next log ends it
        assert run_end(wanted, 0, 300) == 2  # the limit ends it
        assert run_end([(0, log | 100), (1, log | 50)], 0, 10**6) == 1  # file order ends it
        assert run_end(wanted, 3, 10**6) == 4
