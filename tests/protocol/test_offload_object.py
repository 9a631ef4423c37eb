"""The offload object's format (protocol.offload_object): the documented layout, round trips
of any ledger, and every way a damaged or foreign object is refused."""

from __future__ import annotations

import struct
from collections.abc import Callable

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.protocol import offload_object as fmt
from aiobk.protocol.errors import MalformedObjectError
from aiobk.protocol.offload_object import (
    FOOTER_SIZE,
    HEADER_SIZE,
    EntryLocation,
    ObjectEncoder,
    ObjectFooter,
    ObjectHeader,
    check_block,
    check_body,
    check_footer,
    index_span,
    pack_footer,
    pack_header,
    parse_block,
    parse_footer,
    parse_header,
    parse_index,
    parse_locations,
    parse_object,
)

UID = bytes(range(16))


def _crc(data: bytes) -> bytes:
    return struct.pack(">I", crc32c.crc32c(data))


def _header(last: int, ledger_id: int = 7, digest_type: int = 1) -> ObjectHeader:
    return ObjectHeader(ledger_id, 0, last, UID, digest_type)


def _encode(
    bodies: list[bytes], block_size: int = fmt.DEFAULT_BLOCK_SIZE
) -> tuple[bytes, list[bytes]]:
    """The object, and the chunks the encoder handed out."""
    encoder = ObjectEncoder(_header(len(bodies) - 1), block_size)
    chunks: list[bytes] = []
    for entry_id, body in enumerate(bodies):
        chunks += encoder.add(entry_id, body)
    chunks += encoder.finish()
    data = b"".join(chunks)
    assert encoder.footer == parse_footer(data[-FOOTER_SIZE:])
    return data, chunks


def _index_bytes(data: bytes, footer: ObjectFooter) -> bytes:
    return data[footer.index_offset : footer.index_offset + footer.index_length]


def _refused(call: Callable[[], object], match: str | None = None) -> str:
    with pytest.raises(MalformedObjectError, match=match) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def _with_index(data: bytes, edit: Callable[[bytearray], bytes | bytearray]) -> bytes:
    """The object with its index block edited, and the footer made to match it."""
    footer = parse_footer(data[-FOOTER_SIZE:])
    end = footer.index_offset + footer.index_length
    index = bytes(edit(bytearray(data[footer.index_offset : end])))
    new = ObjectFooter(
        footer.index_offset, len(index), footer.ledger_id, footer.entry_count,
        footer.index_offset + len(index) + FOOTER_SIZE, crc32c.crc32c(index),
    )  # fmt: skip
    return data[: footer.index_offset] + index + pack_footer(new)


def test_the_layout_is_the_documented_one() -> None:
    data, _chunks = _encode([b"ab", b"cde"])
    header = (
        b"AIOBKOBJ" + struct.pack(">HHI", 1, 64, 0) + struct.pack(">qqq", 7, 0, 1) + UID
        + b"\x01\0\0\0"
    )  # fmt: skip
    block = (
        b"ABLK" + struct.pack(">Iq", 2, 0) + struct.pack(">I", 2) + b"ab"
        + struct.pack(">I", 3) + b"cde"
    )  # fmt: skip
    index = (
        b"AIOBKIDX" + struct.pack(">qQII", 0, 2, 1, 0)
        + struct.pack(">QII", 64 + 16 + 4, 2, crc32c.crc32c(b"ab"))
        + struct.pack(">QII", 64 + 16 + 4 + 2 + 4, 3, crc32c.crc32c(b"cde"))
        + struct.pack(">QII", 64, len(block), 0)
    )  # fmt: skip
    footer = (
        b"AIOBKEND" + struct.pack(">HHI", 1, 64, 0)
        + struct.pack(">QQqQQ", 64 + len(block), len(index), 7, 2, 128 + len(block) + len(index))
        + _crc(index)
    )  # fmt: skip
    assert data == header + _crc(header) + block + index + footer + _crc(footer)
    assert (len(header) + 4, len(footer) + 4) == (HEADER_SIZE, FOOTER_SIZE)
    assert (fmt.INDEX_RECORD_SIZE, fmt.FORMAT_VERSION) == (16, 1)


def test_an_empty_ledger_is_a_header_an_index_and_a_footer() -> None:
    data, chunks = _encode([])
    assert len(data) == HEADER_SIZE + 32 + FOOTER_SIZE
    assert len(chunks) == 3
    header, bodies = parse_object(data)
    assert (header.last_entry, bodies) == (-1, [])
    footer = parse_footer(data[-FOOTER_SIZE:])
    assert index_span(footer, 0, -1) == (HEADER_SIZE + 32, 0)
    assert parse_locations(b"", 0, footer.index_offset) == []


def test_a_body_larger_than_the_block_size_stands_alone() -> None:
    bodies = [b"x" * 5, b"y" * 100, b"z" * 5, b"w" * 5]
    data, chunks = _encode(bodies, block_size=40)
    footer = parse_footer(data[-FOOTER_SIZE:])
    index = parse_index(
        footer, data[footer.index_offset : footer.index_offset + footer.index_length]
    )
    assert [list(index.block_entries(n)) for n in range(len(index.blocks))] == [[0], [1], [2, 3]]
    assert [len(chunk) for chunk in chunks[1:4]] == [16 + 9, 16 + 104, 16 + 18]
    assert parse_object(data)[1] == bodies


@given(
    st.lists(st.binary(max_size=60), max_size=24),
    st.integers(1, 160),
    st.data(),
)
def test_any_ledger_round_trips(bodies: list[bytes], block_size: int, data: st.DataObject) -> None:
    obj, chunks = _encode(bodies, block_size)
    header = parse_header(obj[:HEADER_SIZE])
    assert header == _header(len(bodies) - 1)
    footer = parse_footer(obj[-FOOTER_SIZE:])
    check_footer(header, footer)
    assert (footer.entry_count, footer.object_length) == (len(bodies), len(obj))
    assert parse_object(obj) == (header, bodies)
    # Any range read from the index records alone, as a reader with the metadata does.
    first = data.draw(st.integers(0, len(bodies)))
    last = data.draw(st.integers(first - 1, len(bodies) - 1))
    start, length = index_span(footer, first, last)
    locations = parse_locations(obj[start : start + length], last - first + 1, footer.index_offset)
    got = [
        check_body(first + i, where, obj[where.offset : where.offset + where.length])
        for i, where in enumerate(locations)
    ]
    assert got == bodies[first : last + 1]
    # Blocks: no bigger than the block size but for one body alone, handed out whole.
    index = parse_index(
        footer, obj[footer.index_offset : footer.index_offset + footer.index_length]
    )
    for number, block in enumerate(index.blocks):
        assert block.length <= block_size or len(index.block_entries(number)) == 1
        assert chunks[1 + number] == obj[block.offset : block.offset + block.length]


@given(
    st.lists(st.binary(max_size=60), max_size=12),
    st.integers(1, 100),
    st.integers(0, 2**32),
    st.integers(1, 255),
)
def test_a_damaged_byte_anywhere_is_refused(
    bodies: list[bytes], block_size: int, where: int, flip: int
) -> None:
    obj, _chunks = _encode(bodies, block_size)
    position = where % len(obj)
    damaged = bytearray(obj)
    damaged[position] ^= flip
    _refused(lambda: parse_object(bytes(damaged)))


@given(st.lists(st.binary(min_size=1, max_size=60), min_size=1, max_size=12), st.data())
def test_a_damaged_body_is_refused_by_its_index_record(
    bodies: list[bytes], data: st.DataObject
) -> None:
    obj, _chunks = _encode(bodies, 64)
    footer = parse_footer(obj[-FOOTER_SIZE:])
    entry = data.draw(st.integers(0, len(bodies) - 1))
    start, length = index_span(footer, entry, entry)
    (where,) = parse_locations(obj[start : start + length], 1, footer.index_offset)
    body = bytearray(obj[where.offset : where.offset + where.length])
    body[data.draw(st.integers(0, len(body) - 1))] ^= data.draw(st.integers(1, 255))
    _refused(lambda: check_body(entry, where, bytes(body)), f"entry {entry}: CRC32C")
    _refused(lambda: check_body(entry, where, bytes(body[1:])), f"entry {entry}: ")


@given(st.binary(max_size=300), st.integers(0, 20))
def test_no_input_breaks_the_parsers(data: bytes, count: int) -> None:
    for call in (
        lambda: parse_header(data),
        lambda: parse_footer(data),
        lambda: parse_locations(data, count, 1000),
        lambda: parse_object(data),
        lambda: parse_header(data[:HEADER_SIZE].ljust(HEADER_SIZE, b"\0")),
        lambda: parse_footer(data[-FOOTER_SIZE:].rjust(FOOTER_SIZE, b"\0")),
    ):
        try:
            call()
        except MalformedObjectError as error:
            message = str(error)
        else:
            message = ""
        assert "\n" not in message


@given(st.tuples(*[st.integers(0, 2**64 - 1)] * 3), st.integers(0, 2**32), st.binary(max_size=200))
def test_a_footer_and_index_under_valid_crcs_are_refused_or_sound(
    numbers: tuple[int, int, int], count: int, index: bytes
) -> None:
    index_offset, entry_count, _ = numbers
    body = struct.pack(
        ">8sHHIQQqQQI", b"AIOBKEND", 1, 64, 0, index_offset % 2**40, len(index),
        count % 2**20, entry_count % 8, index_offset % 2**40 + len(index) + 64,
        crc32c.crc32c(index),
    )  # fmt: skip
    try:
        footer = parse_footer(body + _crc(body))
        parse_index(footer, index)
    except MalformedObjectError:
        pass


def test_pack_header_refuses_what_format_1_cannot_hold() -> None:
    for header, reason in [
        (_header(3, ledger_id=-1), "ledger id -1"),
        (ObjectHeader(7, 1, 3, UID, 1), "first entry 1"),
        (_header(-2), "last entry -2"),
        (_header(2**32), "last entry"),
        (ObjectHeader(7, 0, 3, b"short", 1), "uid of 5 bytes"),
        (_header(3, digest_type=9), "digest type 9"),
    ]:
        with pytest.raises(ValueError, match=reason):
            pack_header(header)


def _header_bytes(**fields: object) -> bytes:
    values: dict[str, object] = {
        "magic": b"AIOBKOBJ", "version": 1, "size": 64, "flags": 0, "ledger": 7, "first": 0,
        "last": 3, "uid": UID, "digest": 1, "reserved": b"\0\0\0",
    }  # fmt: skip
    values.update(fields)
    head = struct.pack(">8sHHIqqq16sB3s", *values.values())
    return head + _crc(head)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\0" * 63, "a header of 63 bytes"),
        (_header_bytes(magic=b"AIOBKXXX"), "not an aiobk object"),
        (_header_bytes(version=2), "format version 2"),
        (_header_bytes()[:60] + b"\0\0\0\0", "header CRC32C"),
        (_header_bytes(size=65), "header size 65"),
        (_header_bytes(flags=1), "flags 0x1"),
        (_header_bytes(reserved=b"\0\0\1"), "reserved 000001"),
        (_header_bytes(ledger=-1), "ledger -1"),
        (_header_bytes(first=1), "entries 1..3"),
        (_header_bytes(last=-2), "entries 0..-2"),
        (_header_bytes(digest=7), "digest type 7"),
    ],
)
def test_a_malformed_header_is_refused(data: bytes, reason: str) -> None:
    _refused(lambda: parse_header(data), reason)


def _footer_bytes(**fields: object) -> bytes:
    values: dict[str, object] = {
        "magic": b"AIOBKEND", "version": 1, "size": 64, "reserved": 0, "offset": 64,
        "length": 32 + 16 * 2 + 16, "ledger": 7, "count": 2, "total": 64 + 80 + 64,
        "crc": 5,
    }  # fmt: skip
    values.update(fields)
    body = struct.pack(">8sHHIQQqQQI", *values.values())
    return body + _crc(body)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\0" * 65, "a footer of 65 bytes"),
        (_footer_bytes(magic=b"AIOBKOBJ"), "footer magic"),
        (_footer_bytes(version=0), "format version 0"),
        (_footer_bytes()[:60] + b"\0\0\0\0", "footer CRC32C"),
        (_footer_bytes(size=32), "footer size 32"),
        (_footer_bytes(reserved=1), "reserved 0x1"),
        (_footer_bytes(ledger=-3), "ledger -3"),
        (_footer_bytes(count=2**32), "4294967296 entries"),
        (_footer_bytes(offset=63), "an index of 80 bytes at 63"),
        (_footer_bytes(length=32 + 16), "an index of 48 bytes"),
        (_footer_bytes(length=32 + 16 * 2 + 8), "an index of 72 bytes"),
        (_footer_bytes(total=1000), "object length 1000"),
    ],
)
def test_a_malformed_footer_is_refused(data: bytes, reason: str) -> None:
    _refused(lambda: parse_footer(data), reason)
    assert parse_footer(_footer_bytes()).entry_count == 2


def test_index_span_takes_ids_of_the_ledger_only() -> None:
    data, _chunks = _encode([b"a", b"b", b"c"])
    footer = parse_footer(data[-FOOTER_SIZE:])
    assert index_span(footer, 1, 2) == (footer.index_offset + 32 + 16, 32)
    for first, last in [(-1, 0), (0, 3), (2, 0), (4, 3)]:
        with pytest.raises(ValueError, match=f"entries {first}..{last} are not in ledger 7's 0..2"):
            index_span(footer, first, last)


def test_locations_outside_the_data_blocks_are_refused() -> None:
    record = struct.pack(">QII", 64 + 16 + 4, 10, 0)
    assert parse_locations(record, 1) == [EntryLocation(84, 10, 0)]
    assert parse_locations(record, 1, 94) == [EntryLocation(84, 10, 0)]
    _refused(lambda: parse_locations(record, 1, 93), "outside the data blocks")
    _refused(lambda: parse_locations(struct.pack(">QII", 83, 0, 0), 1, 93), "at 83\\+0")
    _refused(lambda: parse_locations(record, 2), "16 bytes of index records where 2 take 32")


def _two_blocks() -> bytes:
    return _encode([b"aa", b"bbb", b"cccc"], block_size=30)[0]


def _index_edit(data: bytes, at: int, value: bytes) -> bytes:
    return _with_index(data, lambda index: index[:at] + value + index[at + len(value) :])


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda d: _index_edit(d, 0, b"AIOBKIDY"), "index magic"),
        (lambda d: _index_edit(d, 8, struct.pack(">q", 1)), "entries from 1"),
        (lambda d: _index_edit(d, 16, struct.pack(">Q", 2)), "2 entries"),
        (lambda d: _index_edit(d, 24, struct.pack(">I", 3)), "3 blocks"),
        (lambda d: _index_edit(d, 28, struct.pack(">I", 1)), "index of entries"),
        (lambda d: _with_index(d, lambda i: i + bytes(16)), "index of entries"),
        # Block 0 holds aa and bbb (29 bytes at 64), block 1 cccc (24 bytes at 93); the index
        # is at 117: 32 bytes, 3 entry records, then the block table at 80.
        (lambda d: _index_edit(d, 80, struct.pack(">Q", 65)), "block 0 at 65"),
        (lambda d: _index_edit(d, 80 + 12, struct.pack(">I", 2)), "block 0 at 64 holding 0"),
        (lambda d: _index_edit(d, 96 + 12, struct.pack(">I", 0)), "block 0 at 64 holding 0"),
        (lambda d: _index_edit(d, 96 + 12, struct.pack(">I", 4)), "block 0 at 64 holding 4"),
        (lambda d: _index_edit(d, 32 + 16, struct.pack(">Q", 87)), "entry 1 at 87, not 90"),
        (lambda d: _index_edit(d, 80 + 8, struct.pack(">I", 28)), "block 0 of 28 bytes ends at 93"),
        (
            lambda d: _index_edit(d, 96 + 8, struct.pack(">I", 25)),
            "block 1 of 25 bytes",
        ),
    ],
)
def test_an_index_block_that_does_not_tile_the_data_is_refused(
    edit: Callable[[bytes], bytes], reason: str
) -> None:
    data = _two_blocks()
    assert len(parse_object(data)[1]) == 3
    _refused(lambda: parse_object(edit(data)), reason)


def test_an_index_with_entries_and_no_blocks_is_refused() -> None:
    one = _encode([b""], block_size=30)[0]  # a block of 20 bytes at 64, index at 84
    # Entry 0's record says 84 + 0 and the block table is gone: the data blocks end at 64.
    edited = _with_index(one, lambda i: i[:24] + struct.pack(">I", 0) + i[28:48])
    _refused(lambda: parse_object(edited), "the data blocks end at 64")


def test_index_length_and_crc_are_checked_first() -> None:
    data = _two_blocks()
    footer = parse_footer(data[-FOOTER_SIZE:])
    index = data[footer.index_offset : footer.index_offset + footer.index_length]
    _refused(lambda: parse_index(footer, index[:-1]), "an index of 111 bytes")
    _refused(lambda: parse_index(footer, b"x" + index[1:]), "index CRC32C")


def test_a_block_that_is_not_the_index_s_is_refused() -> None:
    data = _two_blocks()
    footer = parse_footer(data[-FOOTER_SIZE:])
    index = parse_index(footer, data[footer.index_offset : footer.index_offset + 112])
    block = data[64:93]
    assert parse_block(block, index, 0) == [b"aa", b"bbb"]
    _refused(lambda: parse_block(block[:-1], index, 0), "block 0 of 28 bytes")
    _refused(lambda: parse_block(b"ABLX" + block[4:], index, 0), "block 0 says b'ABLX'")
    _refused(
        lambda: parse_block(block[:4] + struct.pack(">I", 1) + block[8:], index, 0), "1 entries"
    )
    _refused(lambda: parse_block(block[:8] + struct.pack(">q", 1) + block[16:], index, 0), "from 1")
    prefix = block[:22] + struct.pack(">I", 9) + block[26:]
    _refused(lambda: parse_block(prefix, index, 0), "entry 1's length prefix 9")
    _refused(lambda: parse_block(block[:-1] + b"X", index, 0), "entry 1: CRC32C")
    check_block(block, index, 0)  # the same checks, no bodies taken out
    _refused(lambda: check_block(block[:-1] + b"X", index, 0), "entry 1: CRC32C")
    _refused(lambda: check_block(prefix, index, 0), "entry 1's length prefix 9")


def test_a_whole_object_is_checked_end_to_end() -> None:
    data = _two_blocks()
    _refused(lambda: parse_object(data[:127]), "127 bytes are too few")
    _refused(lambda: parse_object(b"\0" + data), "magic")
    _refused(
        lambda: parse_object(data[:64] + b"\0" + data[64:]),
        "an object of 294 bytes whose footer says 293",
    )
    other = ObjectEncoder(_header(2, ledger_id=8))
    chunks = [chunk for i, b in enumerate([b"aa", b"bbb", b"cccc"]) for chunk in other.add(i, b)]
    mixed = data[:-FOOTER_SIZE] + b"".join(chunks + other.finish())[-FOOTER_SIZE:]
    _refused(
        lambda: parse_object(mixed), "header names ledger 7 with 3 entries, the footer ledger 8"
    )


def test_runs_of_entries_encode_as_the_entries_one_by_one() -> None:
    bodies = [bytes([i]) * (i * 37 % 150) for i in range(40)]
    one_by_one, _chunks = _encode(bodies, block_size=200)
    for length in (2, 3, 7, 40):
        encoder = ObjectEncoder(_header(len(bodies) - 1), 200)
        chunks: list[bytes] = []
        for start in range(0, len(bodies), length):
            chunks += encoder.add_run(start, bodies[start : start + length])
        chunks += encoder.finish()
        assert b"".join(chunks) == one_by_one, length
    encoder = ObjectEncoder(_header(2), 200)
    with pytest.raises(ValueError, match=r"entry 3 where entry 0 of 0\.\.2 is next"):
        encoder.add_run(0, [b"a", b"b", b"c", b"d"])  # one too many: nothing added
    assert encoder.add_run(0, []) == [pack_header(_header(2))]


def test_the_encoder_refuses_entries_out_of_order_and_use_after_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="block size 0"):
        ObjectEncoder(_header(1), 0)
    encoder = ObjectEncoder(_header(1))
    with pytest.raises(ValueError, match="not finished"):
        _ = encoder.footer
    with pytest.raises(ValueError, match=r"entry 1 where entry 0 of 0\.\.1 is next"):
        encoder.add(1, b"x")
    assert encoder.add(0, b"x") == [pack_header(_header(1))]  # the block stays open
    with pytest.raises(ValueError, match=r"entries 1\.\.1 were not added"):
        encoder.finish()
    monkeypatch.setattr(fmt, "MAX_BODY_SIZE", 3)
    with pytest.raises(ValueError, match="entry 1 of 4 bytes is too long"):
        encoder.add(1, b"abcd")
    encoder.add(1, b"abc")
    with pytest.raises(ValueError, match=r"entry 2 where entry 2 of 0\.\.1 is next"):
        encoder.add(2, b"x")
    encoder.finish()
    with pytest.raises(ValueError, match="is finished"):
        encoder.add(2, b"x")
    with pytest.raises(ValueError, match="is finished"):
        encoder.finish()
