"""The record envelope (client/log/format.py): round trips, its byte layout, and a clear error
for every way an entry can fail to be one."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.client.log import format as log_format
from aiobk.client.log.format import Envelope, RecordFormatError, decode, encode, timestamp_of

names = st.text(max_size=20)
values = st.binary(max_size=64)


@given(
    data=st.binary(max_size=256),
    timestamp=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    key=st.none() | st.binary(max_size=32),
    headers=st.dictionaries(names, values, max_size=5),
)
def test_every_record_comes_back_as_it_went_in(
    data: bytes, timestamp: int, key: bytes | None, headers: dict[str, bytes]
) -> None:
    body = encode(data, timestamp, key, headers)
    assert decode(body) == Envelope(data, timestamp, key, headers)
    assert timestamp_of(body) == timestamp


def test_the_layout_is_the_documented_one() -> None:
    body = encode(b"DATA", 1_700_000_000_123, b"k", {"h": b"vv"})
    assert body == (
        b"\xe1" + struct.pack(">q", 1_700_000_000_123) + struct.pack(">i", 1) + b"k"
        + struct.pack(">H", 1) + struct.pack(">H", 1) + b"h" + struct.pack(">I", 2) + b"vv"
        + b"DATA"
    )  # fmt: skip
    bare = encode(b"x", 5)
    assert len(bare) == 15 + 1  # 15 bytes of envelope
    assert bare[9:13] == struct.pack(">i", -1)  # no key, which is not an empty key
    assert decode(encode(b"x", 5, b"")).key == b""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "shorter than an envelope"),
        (b"\xe1" + b"\0" * 13, "shorter than an envelope"),
        (b"\x00" + b"\0" * 14, "version byte 0x00"),
        (b"\xe1" + b"\0" * 8 + struct.pack(">i", 50) + b"\0\0", "key of 50 bytes runs past"),
        (b"\xe1" + b"\0" * 8 + struct.pack(">i", -2) + b"\0\0", "key length -2"),
        (b"\xe1" + b"\0" * 8 + struct.pack(">i", -1) + struct.pack(">H", 1), "header runs past"),
        (
            b"\xe1" + b"\0" * 8 + struct.pack(">i", -1) + struct.pack(">HH", 1, 9) + b"ab",
            "header name runs past",
        ),
        (
            b"\xe1" + b"\0" * 8 + struct.pack(">i", -1) + struct.pack(">HH", 1, 1) + b"a"
            + struct.pack(">I", 99) + b"v",
            "header value runs past",
        ),
        (
            b"\xe1" + b"\0" * 8 + struct.pack(">i", -1) + struct.pack(">HH", 1, 1) + b"\xff"
            + struct.pack(">I", 0),
            "not UTF-8",
        ),
        (
            b"\xe1" + b"\0" * 8 + struct.pack(">i", -1) + struct.pack(">HH", 2, 1) + b"a"
            + struct.pack(">I", 0) + struct.pack(">H", 1) + b"a" + struct.pack(">I", 0),
            "appears twice",
        ),
    ],
)  # fmt: skip
def test_a_malformed_envelope_is_a_clear_error(body: bytes, message: str) -> None:
    with pytest.raises(RecordFormatError, match=message):
        decode(body)


@given(st.binary(max_size=64))
def test_no_bytes_crash_the_decoder(body: bytes) -> None:
    with contextlib.suppress(RecordFormatError):
        decode(body)


def test_records_that_cannot_be_enveloped_are_refused() -> None:
    with pytest.raises(RecordFormatError, match="does not fit in 64 bits"):
        encode(b"", 2**63)
    with pytest.raises(RecordFormatError, match="header name of 70000 bytes"):
        encode(b"", 0, None, {"n" * 70_000: b""})
    with pytest.raises(RecordFormatError, match="not a record envelope"):
        timestamp_of(b"raw bytes, not an envelope")
    with pytest.raises(ValueError, match="unknown log record format 'zstd'"):
        log_format.check_format("zstd")


@given(
    data=st.binary(max_size=64),
    timestamp=st.integers(min_value=-(2**64), max_value=2**64),
    producer=st.text(min_size=1, max_size=40),
    sequence=st.integers(min_value=-5, max_value=2**64),
)
def test_a_producers_stamp_packs_what_the_encoder_does(
    data: bytes, timestamp: int, producer: str, sequence: int
) -> None:
    """The one-call envelope of a producer's plain records: the same bytes as the general
    encoder, and the same error where the encoder refuses (a timestamp or sequence out of range)."""
    encoded = log_format.check_producer_id(producer)
    stamp = log_format.ProducerStamp(encoded)
    try:
        expected = encode(data, timestamp, None, None, encoded, sequence)
    except RecordFormatError as exc:
        with pytest.raises(RecordFormatError, match=str(exc)):
            stamp.encode(data, timestamp, sequence)
    else:
        assert stamp.encode(data, timestamp, sequence) == expected
        assert decode(expected) == Envelope(data, timestamp, None, {}, producer, sequence)
