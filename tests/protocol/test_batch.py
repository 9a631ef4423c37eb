"""ADD_BATCH's packing (protocol.batch): round trips and every way a batch is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.protocol import (
    MAX_BATCH_ENTRIES,
    BatchError,
    DigestType,
    StatusCode,
    pack_bodies,
    pack_entry,
    pack_header,
    pack_statuses,
    unpack_bodies,
    unpack_range,
    unpack_statuses,
)
from aiobk.protocol.limits import MAX_ENTRY_ID


def _entry(ledger_id: int, entry_id: int, payload: bytes = b"p") -> bytes:
    header = pack_header(ledger_id, entry_id, -1, len(payload), DigestType.DUMMY)
    return pack_entry(header, b"", payload)


@given(
    st.lists(st.binary(max_size=40), min_size=1, max_size=30),
    st.integers(0, 2**40),
    st.integers(0, 2**40),
)
def test_bodies_round_trip(payloads: list[bytes], ledger_id: int, first: int) -> None:
    bodies = [_entry(ledger_id, first + 2 * i, p) for i, p in enumerate(payloads)]
    unpacked = unpack_bodies(pack_bodies(bodies), ledger_id)
    assert unpacked == [(first + 2 * i, -1, body) for i, body in enumerate(bodies)]


@pytest.mark.parametrize(
    ("packed", "reason"),
    [
        (b"", "no entries"),
        (b"\x00\x00", "cut short"),
        (b"\x00\x00\x00\x05abcde", "do not fit"),  # shorter than an entry header
        (pack_bodies([_entry(7, 0)])[:-1], "do not fit"),
        (pack_bodies([_entry(8, 0)]), "of ledger 8"),
        (pack_bodies([_entry(7, 0)[:1] + b"\x63" + _entry(7, 0)[2:]]), "unknown digest type 99"),
        (pack_bodies([_entry(7, 1), _entry(7, 1)]), "not increasing"),
        (pack_bodies([_entry(7, 2), _entry(7, 1)]), "not increasing"),
        (pack_bodies([_entry(7, -5)]), "not increasing"),
        (pack_bodies([_entry(7, MAX_ENTRY_ID + 1)]), "too large"),
        (pack_bodies([_entry(7, i) for i in range(MAX_BATCH_ENTRIES + 1)]), "more than"),
    ],
)
def test_a_batch_that_does_not_unpack_is_refused_whole(packed: bytes, reason: str) -> None:
    with pytest.raises(BatchError, match=reason):
        unpack_bodies(packed, 7)


def test_the_largest_batch_unpacks() -> None:
    packed = pack_bodies([_entry(7, i) for i in range(MAX_BATCH_ENTRIES)])
    assert len(unpack_bodies(packed, 7)) == MAX_BATCH_ENTRIES


def test_statuses_are_empty_when_all_are_ok() -> None:
    assert pack_statuses([StatusCode.EOK] * 3) == b""
    assert unpack_statuses(b"", 3) == [StatusCode.EOK] * 3
    mixed = [StatusCode.EOK, StatusCode.EFENCED, StatusCode.EBADREQ]
    assert unpack_statuses(pack_statuses(mixed), 3) == mixed


def test_statuses_of_the_wrong_count_or_unknown_codes() -> None:
    with pytest.raises(BatchError, match="2 statuses for 3"):
        unpack_statuses(b"\x00\x01", 3)
    assert unpack_statuses(b"\x00\xfa", 2) == [StatusCode.EOK, StatusCode.EIO]


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30), st.integers(0, 2**40))
def test_a_range_round_trips(payloads: list[bytes], first: int) -> None:
    bodies = [_entry(7, first + i, p) for i, p in enumerate(payloads)]
    last = first + len(bodies) - 1
    assert unpack_range(pack_bodies(bodies), 7, first, last) == bodies
    assert unpack_range(pack_bodies(bodies[:1]), 7, first, last) == bodies[:1]


@pytest.mark.parametrize(
    ("bodies", "reason"),
    [
        ([_entry(7, 11), _entry(7, 12)], "not a run from 10"),  # not from the first asked
        ([_entry(7, 10), _entry(7, 12)], "not a run from 10"),  # a gap
        ([_entry(7, i) for i in range(10, 22)], "within 10..20"),  # past the last asked
        ([_entry(8, 10)], "of ledger 8"),
    ],
)
def test_a_range_that_is_not_the_run_asked_is_refused(bodies: list[bytes], reason: str) -> None:
    with pytest.raises(BatchError, match=reason):
        unpack_range(pack_bodies(bodies), 7, 10, 20)
