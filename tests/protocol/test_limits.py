"""What a bookie accepts at its door (``protocol.limits``), pure: no sockets, no disks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.protocol import (
    MASTER_KEY_SIZE,
    MAX_ENTRY_ID,
    AddBatchRequest,
    AddFlag,
    AddRequest,
    ForceRequest,
    GcRequest,
    HandshakeRequest,
    MalformedMessageError,
    OpCode,
    ReadFlag,
    ReadLacRequest,
    ReadRangeRequest,
    ReadRequest,
    Request,
    WriteLacRequest,
    check_request,
)

KEY = b"k" * MASTER_KEY_SIZE
INT64_MAX = 2**63 - 1

GOOD: list[Request] = [
    AddRequest(1, 0, 0, master_key=KEY, body=b"x"),
    AddRequest(1, INT64_MAX, MAX_ENTRY_ID, AddFlag.RECOVERY_ADD, master_key=KEY),
    AddBatchRequest(1, 0, AddFlag.RECOVERY_ADD, master_key=KEY, bodies=b"checked when handled"),
    ReadRequest(1, 5, -1),
    ReadRequest(1, 5, 3, ReadFlag.FENCE, KEY),
    ReadRequest(1, 5, -1, ReadFlag.LONG_POLL, b"", -1, 0),
    ReadRequest(1, 5, 0, ReadFlag.LONG_POLL, KEY, MAX_ENTRY_ID, 10),
    WriteLacRequest(1, 5, KEY, -1),
    ForceRequest(1, 5),
    ForceRequest(1, 5, KEY),
    ReadLacRequest(1, 0),
    ReadRangeRequest(1, 5, 0, 0, 1),
    ReadRangeRequest(1, 5, 0, MAX_ENTRY_ID, INT64_MAX),
    HandshakeRequest(1),
    GcRequest(1),
]

BAD: list[tuple[Request, str]] = [
    (AddRequest(7, -1, 0, master_key=KEY), "ledger id -1"),
    (AddRequest(7, 1, -1, master_key=KEY), "entry id -1"),
    (AddRequest(7, 1, INT64_MAX, master_key=KEY), "entry id"),
    (AddRequest(7, 1, 0, AddFlag(4), master_key=KEY), "unknown flags"),
    (AddRequest(7, 1, 0, master_key=b""), "master key of 0 bytes"),
    (AddRequest(7, 1, 0, master_key=b"k" * 256), "master key of 256 bytes"),
    (AddBatchRequest(7, -1, master_key=KEY), "ledger id -1"),
    (AddBatchRequest(7, 1, AddFlag(4), master_key=KEY), "unknown flags"),
    (AddBatchRequest(7, 1, master_key=b""), "master key of 0 bytes"),
    (ReadRangeRequest(7, -5, 0, 1, 1), "ledger id"),
    (ReadRangeRequest(7, 1, -1, 1, 1), "not a range"),
    (ReadRangeRequest(7, 1, 5, 4, 1), "not a range"),
    (ReadRangeRequest(7, 1, 0, MAX_ENTRY_ID + 1, 1), "not a range"),
    (ReadRangeRequest(7, 1, 0, 1, 0), "max_bytes 0"),
    (ReadRequest(7, -5, 0), "ledger id"),
    (ReadRequest(7, 1, -2), "entry id -2"),
    (ReadRequest(7, 1, 0, ReadFlag(8)), "unknown flags"),
    (ReadRequest(7, 1, 0, ReadFlag.FENCE, b""), "want 32 bytes"),
    (ReadRequest(7, 1, 0, ReadFlag.NONE, b"short"), "empty or 32 bytes"),
    (ReadRequest(7, 1, -1, ReadFlag.LONG_POLL, b"", -2, 10), "previous LAC"),
    (ReadRequest(7, 1, -1, ReadFlag.LONG_POLL, b"", 0, -1), "negative long-poll"),
    (WriteLacRequest(7, 1, KEY, -3), "LAC -3"),
    (WriteLacRequest(7, 1, b"", 0), "master key"),
    (WriteLacRequest(7, -1, KEY, 0), "ledger id"),
    (ForceRequest(7, 1, b"x"), "master key"),
    (ForceRequest(7, -1), "ledger id"),
    (ReadLacRequest(7, -1), "ledger id"),
]


@pytest.mark.parametrize("request_", GOOD)
def test_requests_within_the_limits_pass(request_: Request) -> None:
    check_request(request_)


@pytest.mark.parametrize(("request_", "why"), BAD)
def test_requests_past_the_limits_carry_their_txn_and_op(request_: Request, why: str) -> None:
    with pytest.raises(MalformedMessageError, match=why) as caught:
        check_request(request_)
    assert caught.value.txn_id == 7  # the bookie answers EBADREQ and keeps the connection
    assert caught.value.op == request_.op


@given(
    st.integers(min_value=-(2**63), max_value=INT64_MAX),
    st.integers(min_value=-(2**63), max_value=INT64_MAX),
    st.binary(max_size=40),
)
def test_an_accepted_add_is_one_storage_can_hold(ledger: int, entry: int, key: bytes) -> None:
    request = AddRequest(1, ledger, entry, master_key=key)
    try:
        check_request(request)
    except MalformedMessageError:
        assert ledger < 0 or not 0 <= entry <= MAX_ENTRY_ID or len(key) != MASTER_KEY_SIZE
        return
    assert 0 <= ledger <= INT64_MAX
    assert 0 <= entry < INT64_MAX  # entry + 1 still fits an int64
    assert len(key) == MASTER_KEY_SIZE  # fits the index's u8 key length
    assert request.op is OpCode.ADD
