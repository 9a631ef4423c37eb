"""Round trips and hostile input for the pure codec (tier one: no sockets, no disks)."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import pathlib
import tracemalloc
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk import protocol
from aiobk.protocol import (
    AddBatchRequest,
    AddBatchResponse,
    AddFlag,
    AddRequest,
    AddResponse,
    BookieStateRequest,
    BookieStateResponse,
    Durability,
    ErrorResponse,
    ForceRequest,
    ForceResponse,
    FrameDecoder,
    FrameTooLargeError,
    GcReportRequest,
    GcReportResponse,
    GcRequest,
    GcResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    HandshakeRequest,
    HandshakeResponse,
    LedgerKeyRequest,
    LedgerKeyResponse,
    MalformedMessageError,
    Message,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    StateChange,
    StatusCode,
    WriteLacRequest,
    WriteLacResponse,
    decode_request,
    decode_response,
    encode,
)
from aiobk.protocol.messages import REQUEST_TYPES, RESPONSE_TYPES

i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small = st.binary(max_size=64)
status = st.sampled_from(list(StatusCode))

requests = st.one_of(
    st.builds(HandshakeRequest, i64, i64, st.text(max_size=20)),
    st.builds(
        AddRequest,
        i64,
        i64,
        i64,
        st.sampled_from(list(AddFlag)),
        st.sampled_from(list(Durability)),
        small,
        small,
    ),
    st.builds(
        AddBatchRequest,
        i64,
        i64,
        st.sampled_from(list(AddFlag)),
        st.sampled_from(list(Durability)),
        small,
        small,
    ),
    st.builds(ReadRequest, i64, i64, i64, st.sampled_from(list(ReadFlag)), small, i64, i64),
    st.builds(ReadLacRequest, i64, i64),
    st.builds(WriteLacRequest, i64, i64, small, i64),
    st.builds(ForceRequest, i64, i64, small),
    st.builds(GetBookieInfoRequest, i64),
    st.builds(GcRequest, i64),
    st.builds(GcReportRequest, i64),
    st.builds(BookieStateRequest, i64, st.sampled_from(list(StateChange))),
    st.builds(LedgerKeyRequest, i64, i64, small),
)
responses = st.one_of(
    st.builds(HandshakeResponse, i64, status, i64, st.text(max_size=20)),
    st.builds(AddResponse, i64, status, i64, i64, i64),
    st.builds(AddBatchResponse, i64, status, i64, i64, small),
    st.builds(ReadResponse, i64, status, i64, i64, i64, i64, st.none() | small),
    st.builds(ReadLacResponse, i64, status, i64, i64, i64),
    st.builds(WriteLacResponse, i64, status, i64, i64),
    st.builds(ForceResponse, i64, status, i64, i64),
    st.builds(
        GetBookieInfoResponse,
        i64,
        status,
        i64,
        i64,
        st.dictionaries(st.text(max_size=8), i64, max_size=4),
    ),
    st.builds(GcResponse, i64, status, i64, i64, i64, i64, st.text(max_size=20)),
    st.builds(GcReportResponse, i64, status, st.text(max_size=40)),
    st.builds(
        BookieStateResponse, i64, status, i64, st.text(max_size=20), i64, st.text(max_size=9)
    ),
    st.builds(LedgerKeyResponse, i64, status, i64, small),
    st.builds(ErrorResponse, i64, status, st.integers(0, 255)),
)


def _payload(message: Message) -> bytes:
    data = encode(message)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    return data[4:]


@given(requests)
def test_request_round_trip(message: Any) -> None:
    decoded = decode_request(_payload(message))
    assert decoded == message
    assert type(decoded) is type(message)


@given(responses)
def test_response_round_trip(message: Any) -> None:
    decoded = decode_response(_payload(message))
    assert decoded == message
    assert type(decoded) is type(message)


@given(st.lists(st.one_of(requests), max_size=8), st.integers(1, 17))
def test_decoder_reassembles_any_split(messages: list[Any], chunk: int) -> None:
    stream = b"".join(encode(m) for m in messages)
    decoder = FrameDecoder()
    frames: list[bytes] = []
    for start in range(0, len(stream), chunk):
        frames.extend(decoder.feed(stream[start : start + chunk]))
    assert [decode_request(f) for f in frames] == messages
    assert decoder.buffered == 0


@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_anything_but_malformed(data: bytes) -> None:
    for decode in (decode_request, decode_response):
        with contextlib.suppress(MalformedMessageError):
            decode(data)


@given(st.lists(st.one_of(i64, st.binary(max_size=8), st.none(), st.text(max_size=4))))
def test_random_arrays_are_rejected_or_valid(items: list[Any]) -> None:
    data = msgpack.packb(items, use_bin_type=True)
    for decode in (decode_request, decode_response):
        try:
            decoded = decode(data)
        except MalformedMessageError:
            continue
        assert decoded.to_wire() == items


@given(st.lists(st.one_of(requests), min_size=1, max_size=6), st.integers(1, 40), st.data())
def test_decoder_takes_any_buffer_type_and_gives_bytes(
    messages: list[Any], chunk: int, data: st.DataObject
) -> None:
    """Reads come as bytes (sliced out directly while nothing is buffered) or as other buffers
    (always through the buffer); mixed, split anywhere, the frames are the same bytes."""
    stream = b"".join(encode(m) for m in messages)
    decoder = FrameDecoder()
    frames: list[bytes] = []
    for start in range(0, len(stream), chunk):
        piece = stream[start : start + chunk]
        kind = data.draw(st.sampled_from([bytes, bytearray, memoryview]))
        frames.extend(decoder.feed(kind(piece)))
    assert all(type(f) is bytes for f in frames)
    assert [decode_request(f) for f in frames] == messages
    assert decoder.buffered == 0


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_oversized_frame_is_refused_before_allocation(kind: type[bytes | bytearray]) -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    with pytest.raises(FrameTooLargeError) as info:
        decoder.feed(kind((10**9).to_bytes(4, "big") + b"x"))
    assert info.value.size == 10**9
    assert "exceeds" in str(info.value)


def test_decoder_rejects_nonpositive_limit() -> None:
    with pytest.raises(ValueError, match="positive"):
        FrameDecoder(max_frame_size=0)


def test_decoder_compacts_large_consumed_prefix() -> None:
    decoder = FrameDecoder()
    big = encode(AddRequest(1, 1, 0, body=b"x" * 70000))
    half = encode(AddRequest(2, 1, 1, body=b"y" * 10))
    out = decoder.feed(bytearray(big + half[:5]))  # not bytes: through the buffer
    assert len(out) == 1
    assert decoder.buffered == 5
    out = decoder.feed(half[5:])
    assert decode_request(out[0]) == AddRequest(2, 1, 1, body=b"y" * 10)


@given(
    st.lists(st.integers(0, 300_000), min_size=1, max_size=5),
    st.lists(st.integers(1, 200_000), min_size=1, max_size=8),
    st.data(),
)
def test_decoder_reassembles_large_frames_split_anywhere(
    sizes: list[int], cuts: list[int], data: st.DataObject
) -> None:
    """Frames up to 300 KB in reads of every size, small and large, of any buffer type: the
    same frames, once each, and nothing held after the last."""
    payloads = [bytes([n % 251]) * n for n in sizes]
    stream = b"".join(protocol.frame(p) for p in payloads)
    decoder = FrameDecoder(max_frame_size=300_000)
    frames: list[bytes] = []
    at, turn = 0, 0
    while at < len(stream):
        piece = stream[at : at + cuts[turn % len(cuts)]]
        kind = data.draw(st.sampled_from([bytes, bytearray, memoryview]))
        frames.extend(decoder.feed(kind(piece)))
        at += len(piece)
        turn += 1
        assert decoder.buffered == at - sum(4 + len(f) for f in frames)
    assert frames == payloads
    assert all(type(f) is bytes for f in frames)
    assert decoder.buffered == 0


def test_a_frame_trickled_a_byte_at_a_time_is_held_in_its_size_not_an_object_a_byte() -> None:
    payload = b"p" * 200_000
    stream = protocol.frame(payload)
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        for at in range(len(stream) - 1):
            assert decoder.feed(stream[at : at + 1]) == []
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoder.buffered == len(stream) - 1
    assert held < 2 * len(stream)  # one byte object each would be about 34 times the bytes
    assert decoder.feed(stream[-1:]) == [payload]


def test_frame_helper() -> None:
    assert protocol.frame(b"abc") == b"\x00\x00\x00\x03abc"


@pytest.mark.parametrize(
    ("value", "reason", "txn"),
    [
        ({"a": 1}, "array", None),
        ([1], "array", None),
        ([1, "x"], "txn_id", None),
        ([1, 2**64 - 1], "txn_id", None),
        (["x", 5], "tag", 5),
        ([99, 5], "unknown message tag", 5),
        ([2, 5, 1], "takes 6 fields", 5),
        ([2, 5, 1, 0, 0, 0, "key", b""], "master_key", 5),
        ([2, 5, 1, 0, 0, 9, b"", b""], "durability", 5),
        ([12, 5, 1, 0, 9, b"", b""], "durability", 5),
        ([9, 5, 7], "unknown state change", 5),
        ([2, 5, 2**64 - 1, 0, 0, 0, b"", b""], "out of range", 5),
        ([4, 5, True], "bool not allowed", 5),
    ],
)
def test_malformed_requests(value: Any, reason: str, txn: int | None) -> None:
    with pytest.raises(MalformedMessageError, match=reason) as info:
        decode_request(msgpack.packb(value, use_bin_type=True))
    assert info.value.txn_id == txn


def test_malformed_responses() -> None:
    with pytest.raises(MalformedMessageError, match="unknown status") as info:
        decode_response(msgpack.packb([0x82, 7, 55, 1, 2, 3]))
    assert info.value.txn_id == 7
    assert info.value.op == 0x82
    with pytest.raises(MalformedMessageError, match="str -> int"):
        decode_response(msgpack.packb([0x87, 7, 0, 1, 2, {"a": "b"}]))
    with pytest.raises(MalformedMessageError, match="msgpack"):
        decode_response(b"\xc1")
    with pytest.raises(MalformedMessageError, match="msgpack"):
        decode_response(msgpack.packb([0x87, 7]) + b"extra")


def test_every_tag_is_registered_once() -> None:
    assert set(REQUEST_TYPES).isdisjoint(RESPONSE_TYPES)
    for cls in REQUEST_TYPES.values():
        assert cls.tag == cls.op
    for tag, cls in RESPONSE_TYPES.items():
        assert cls.tag == tag


def test_explicit_negatives() -> None:
    negatives = {code for code in StatusCode if code.is_explicit_negative}
    assert negatives == {StatusCode.ENOLEDGER, StatusCode.ENOENTRY}


def test_protocol_package_imports_no_io() -> None:
    """The codec knows no sockets (no asyncio, socket, threading or file I/O)."""
    forbidden = {"asyncio", "socket", "threading", "selectors", "os", "io", "uvloop"}
    root = pathlib.Path(protocol.__file__).parent
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"


@given(st.one_of(requests, responses))
def test_the_generated_paths_match_the_dataclass(message: Any) -> None:
    """protocol.compiled writes to_wire, from_fields and _decode per class: they must agree with the
    dataclass itself (its fields in order, its equality, its frozenness)."""
    names = [f.name for f in dataclasses.fields(message)]
    wire = [message.tag, *[getattr(message, name) for name in names]]
    assert message.to_wire() == wire
    rebuilt = type(message).from_values(wire[1:])
    assert rebuilt == message
    assert type(message).from_fields(*wire[1:]) == message
    with pytest.raises(dataclasses.FrozenInstanceError):
        rebuilt.txn_id = 1


@given(
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.sampled_from(list(protocol.AddFlag)),
    st.sampled_from(list(protocol.Durability)),
    st.sampled_from([b"", b"k" * 32]),
    st.one_of(st.binary(max_size=300), st.sampled_from([0xFFFF, 0x10000, 0x10001]).map(bytes)),
)
def test_a_frame_in_two_parts_is_the_frame_in_one(
    txn_id: int, ledger_id: int, flags: Any, durability: Any, key: bytes, bodies: bytes
) -> None:
    request = protocol.AddBatchRequest(txn_id, ledger_id, flags, durability, key, bodies)
    head, tail = protocol.encode_parts(request)
    assert tail is bodies  # written as it is, never copied into the frame
    assert head + tail == protocol.encode(request)
    assert protocol.decode_request((head + tail)[4:]) == request


def test_a_frame_in_two_parts_needs_bytes_last() -> None:
    with pytest.raises(TypeError, match="the last field is not bytes"):
        protocol.encode_parts(protocol.ReadLacRequest(1, 5))
