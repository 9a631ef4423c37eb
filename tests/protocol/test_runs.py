"""A READ_RANGE answer checked in one pass (protocol/_runs.pyx): the compiled check takes
exactly the answers the pure-Python checks pass whole, with the same bodies, and leaves every
other answer to them (``client.run_check`` chooses it)."""

from __future__ import annotations

import copy
import hashlib
import hmac
import importlib
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.protocol import (
    MAX_BATCH_ENTRIES,
    BatchError,
    DigestType,
    pack_bodies,
    pack_entry,
    pack_header,
    peek_header,
    unpack_range,
)
from aiobk.protocol.entry import HEADER_SIZE
from aiobk.protocol.errors import MalformedObjectError
from aiobk.protocol.limits import MAX_ENTRY_ID
from aiobk.protocol.offload_object import (
    _RECORD,
    BLOCK_HEADER_SIZE,
    INDEX_HEADER_SIZE,
    BlockLocation,
    ObjectEncoder,
    ObjectHeader,
    ObjectIndex,
    _check_tiling_pure,
    pack_run,
    parse_block,
    parse_index,
)
from aiobk.protocol.offload_object import HEADER_SIZE as OBJECT_HEADER_SIZE

LEDGER = 7
KEY = b"k" * 32

# The compiled module whatever AIOBK_NO_EXTENSIONS says: ``make setup`` builds it, and these
# tests hold it to the pure checks.
compiled: ModuleType = importlib.import_module("aiobk.protocol._runs")


def _body(entry_id: int, payload: bytes, kind: DigestType, ledger_id: int = LEDGER) -> bytes:
    header = pack_header(ledger_id, entry_id, entry_id - 1, len(payload), kind)
    if kind is DigestType.CRC32C:
        digest = crc32c.crc32c(payload, crc32c.crc32c(header)).to_bytes(4, "big")
    elif kind is DigestType.MAC:
        digest = hmac.new(KEY, header + payload, hashlib.sha256).digest()
    else:
        digest = b""
    return pack_entry(header, digest, payload)


def _reference(
    packed: bytes, ledger_id: int, first: int, last: int, kind: int, check_digest: bool
) -> list[bytes] | None:
    """What the pure checks pass whole: ``unpack_range``, then each body's ids, digest type
    and (CRC32C) digest; None if any of them fails."""
    try:
        bodies = unpack_range(packed, ledger_id, first, last)
    except BatchError:
        return None
    for entry_id, body in enumerate(bodies, first):
        if peek_header(body)[:2] != (ledger_id, entry_id) or body[1] != kind:
            return None
        if check_digest and kind == DigestType.CRC32C:
            crc = crc32c.crc32c(body[HEADER_SIZE + 4 :], crc32c.crc32c(body[:HEADER_SIZE]))
            if crc != int.from_bytes(body[HEADER_SIZE : HEADER_SIZE + 4], "big"):
                return None
    return bodies


def _answer(payloads: list[bytes], kind: DigestType, first: int = 0) -> list[bytes]:
    return [_body(first + i, payload, kind) for i, payload in enumerate(payloads)]


@given(
    payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=40),
    kind=st.sampled_from([DigestType.DUMMY, DigestType.CRC32C, DigestType.MAC]),
    first=st.integers(0, 1000),
    damage=st.none() | st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
    spare=st.integers(0, 3),
)
def test_the_compiled_check_takes_what_the_pure_checks_pass_whole(
    payloads: list[bytes],
    kind: DigestType,
    first: int,
    damage: tuple[int, int] | None,
    spare: int,
) -> None:
    packed = bytearray(pack_bodies(_answer(payloads, kind, first)))
    if damage is not None:  # one byte flipped anywhere: a length, a header, a digest, a payload
        at, flip = damage
        packed[at % len(packed)] ^= flip
    last = first + len(payloads) - 1 + spare
    for check_digest in (True, False):
        got = compiled.check_run(bytes(packed), LEDGER, first, last, int(kind), check_digest)
        if kind is DigestType.MAC and check_digest:
            assert got is None  # HMAC stays on the pure path
            continue
        if not check_digest and kind is DigestType.CRC32C:
            continue  # a copier always checks a CRC32C: never asked
        assert got == _reference(bytes(packed), LEDGER, first, last, int(kind), check_digest)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda bodies: bodies[:1] + bodies[2:], "a gap in the run"),
        (lambda bodies: bodies[1:], "not from the first asked"),
        (lambda bodies: [_body(0, b"x", DigestType.CRC32C, 8), *bodies[1:]], "another ledger"),
        (lambda bodies: [_body(0, b"x", DigestType.DUMMY), *bodies[1:]], "another digest type"),
        (lambda bodies: [], "no entries"),
    ],
)
def test_an_answer_that_is_not_the_run_asked_for_is_left_to_the_pure_checks(
    change: Callable[[list[bytes]], list[bytes]], why: str
) -> None:
    bodies = change(_answer([b"a", b"bb", b"ccc"], DigestType.CRC32C))
    assert compiled.check_run(pack_bodies(bodies), LEDGER, 0, 2, 1, True) is None, why


def test_a_run_longer_than_asked_or_than_a_batch_is_left_to_the_pure_checks() -> None:
    packed = pack_bodies(_answer([b"a", b"b", b"c"], DigestType.DUMMY))
    assert compiled.check_run(packed, LEDGER, 0, 1, 0, True) is None  # entry 2 not asked for
    many = pack_bodies(_answer([b""] * (MAX_BATCH_ENTRIES + 1), DigestType.DUMMY))
    assert compiled.check_run(many, LEDGER, 0, MAX_BATCH_ENTRIES, 0, True) is None
    whole = pack_bodies(_answer([b""] * MAX_BATCH_ENTRIES, DigestType.DUMMY))
    taken = compiled.check_run(whole, LEDGER, 0, MAX_BATCH_ENTRIES, 0, True)
    assert taken is not None
    assert len(taken) == MAX_BATCH_ENTRIES
    assert compiled.check_run(packed[:-1], LEDGER, 0, 2, 0, True) is None  # cut short
    assert compiled.check_run(packed + b"\0\0", LEDGER, 0, 2, 0, True) is None  # a torn length


@pytest.mark.parametrize(
    "arguments",
    [
        (bytearray(b"x"), LEDGER, 0, 2, 1, True),
        (b"x", "7", 0, 2, 1, True),
        (b"x", LEDGER, -1, 2, 1, True),
        (b"x", LEDGER, 0, MAX_ENTRY_ID + 1, 1, True),
        (b"x", LEDGER, 0, 2**63, 1, True),
        (b"x", LEDGER, 0, 2, DigestType.CRC32C, True),  # an IntEnum, not an int
        (b"x", LEDGER, 0, 2, 9, True),
    ],
)
def test_arguments_of_other_shapes_are_left_to_the_pure_checks(arguments: tuple) -> None:
    assert compiled.check_run(*arguments) is None


@given(
    sizes=st.lists(st.integers(0, 300), max_size=30),
    block_size=st.integers(17, 1200),
    held=st.lists(st.integers(0, 200), max_size=3),
    offset=st.integers(0, 2**40),
    first=st.integers(0, 5),
)
def test_pack_run_adds_what_its_pure_twin_adds(
    sizes: list[int], block_size: int, held: list[int], offset: int, first: int
) -> None:
    bodies = [bytes([size % 251]) * size for size in sizes]
    first = min(first, len(bodies))
    results = []
    for pack in (compiled.pack_run, pack_run):
        block = bytearray(BLOCK_HEADER_SIZE)
        for size in held:  # a block that holds entries already
            block += size.to_bytes(4, "big") + b"h" * size
        records = bytearray(b"r" * 16)
        stop = pack(block, block_size, records, offset, bodies, first)
        results.append((stop, bytes(block), bytes(records)))
    assert results[0] == results[1]
    stop, block, _records = results[0]
    assert first <= stop <= len(bodies)
    if stop > first and len(block) > block_size:  # over the size only by a block's first entry
        assert not held
        assert stop == first + 1


def _outcome(pack: Callable[..., int], arguments: tuple[Any, ...]) -> tuple[Any, ...]:
    """What ``pack`` returns or raises, and what it left in its mutable arguments."""
    copies = tuple(copy.copy(a) if isinstance(a, bytearray) else a for a in arguments)
    try:
        result: Any = pack(*copies)
    except Exception as exc:
        result = type(exc)
    return result, *(bytes(a) for a in copies if isinstance(a, bytearray))


@pytest.mark.parametrize(
    "arguments",
    [
        (bytearray(16), 100, bytearray(), 0, [bytearray(b"x")], 0),  # not bytes
        (bytearray(16), 100, bytearray(), 0, (b"a", memoryview(b"b")), 0),
        (bytes(16), 100, bytearray(), 0, [b"x"], 0),  # a block that cannot grow
        (bytearray(16), 100, bytearray(), -1, [b"x"], 0),  # an offset out of range
        (bytearray(16), 100, bytearray(), 0, [b"x"], 2),  # past the bodies
        (bytearray(4), 100, bytearray(), 0, [b"x"], 0),  # no room for the block's header
    ],
)
def test_pack_run_of_other_shapes_is_its_pure_twin(arguments: tuple[Any, ...]) -> None:
    assert _outcome(compiled.pack_run, arguments) == _outcome(pack_run, arguments)


def _object(bodies: list[bytes], block_size: int) -> tuple[bytes, ObjectIndex]:
    header = ObjectHeader(LEDGER, 0, len(bodies) - 1, b"u" * 16, 1)
    encoder = ObjectEncoder(header, block_size)
    data = b"".join([*encoder.add_run(0, bodies), *encoder.finish()])
    footer = encoder.footer
    index = parse_index(
        footer, data[footer.index_offset : footer.index_offset + footer.index_length]
    )
    return data, index


@given(
    sizes=st.lists(st.integers(0, 200), min_size=1, max_size=30),
    block_size=st.integers(17, 600),
    damage=st.none() | st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
)
def test_check_entries_passes_the_blocks_the_pure_checks_pass(
    sizes: list[int], block_size: int, damage: tuple[int, int] | None
) -> None:
    data, index = _object([bytes([s % 7]) * s for s in sizes], block_size)
    for number, block in enumerate(index.blocks):
        raw = bytearray(data[block.offset : block.offset + block.length])
        if damage is not None:  # a byte flipped anywhere in the block
            raw[damage[0] % len(raw)] ^= damage[1]
        entries = index.block_entries(number)
        try:
            _block_checks(bytes(raw), index, number)
            passes = True
        except MalformedObjectError:
            passes = False
        got = compiled.check_entries(
            bytes(raw), block.offset, index.records, entries.start, entries.stop
        )
        if got:  # the header is the pure path's to check: only the entries are the C's
            assert (
                passes
                or bytes(raw[:BLOCK_HEADER_SIZE])
                != data[block.offset : block.offset + BLOCK_HEADER_SIZE]
            )
        else:
            assert not passes


def _block_checks(data: bytes, index: ObjectIndex, number: int) -> None:
    """The pure checks of a block's entries: ``parse_block`` takes no compiled path."""
    parse_block(data, index, number)


def _stored(*records: tuple[int, int, int]) -> bytes:
    """Index records as stored: u64 offset, u32 length, u32 CRC32C (or first position)."""
    return b"".join(_RECORD.pack(*record) for record in records)


@pytest.mark.parametrize(
    "arguments",
    [
        (bytearray(b"x"), 0, b"", 0, 0),
        (b"x", 0, bytearray(), 0, 0),
        (b"x", 0, [], 0, 0),  # records as tuples, not as stored
        (b"x", 0, b"", 0, 1),  # more entries than records
        (b"x", -1, b"", 0, 0),
        (b"x", 2**63, b"", 0, 0),
        (b"xxxxx", 0, _stored((4, 1, 0))[:15], 0, 1),  # a record cut short
        (b"xxxxx", 0, _stored((2, 1, 0)), 0, 1),  # before its prefix
        (b"xxxxx", 0, _stored((4, 2, 0)), 0, 1),  # past the block
        (b"xxxxx", 0, _stored((4, 2**32 - 1, 0)), 0, 1),  # longer than the block
        (b"\0\0\0\1x", 0, _stored((4, 1, crc32c.crc32c(b"y"))), 0, 1),  # not its CRC
        (b"\0\0\0\2x", 0, _stored((4, 1, crc32c.crc32c(b"x"))), 0, 1),  # not its prefix
    ],
)
def test_check_entries_leaves_what_it_cannot_read_to_the_pure_checks(
    arguments: tuple[Any, ...],
) -> None:
    assert compiled.check_entries(*arguments) is False


def test_check_entries_of_no_entries_and_of_good_ones_is_true() -> None:
    body = b"x"
    block = b"\0" * 16 + len(body).to_bytes(4, "big") + body
    assert compiled.check_entries(block, 100, b"", 0, 0) is True
    good = _stored((120, 1, crc32c.crc32c(body)))
    assert compiled.check_entries(block, 100, good, 0, 1) is True


@given(
    sizes=st.lists(st.integers(0, 200), max_size=30),
    block_size=st.integers(17, 600),
    damage=st.none() | st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
    end_shift=st.sampled_from([0, 0, 0, -1, 1, -(2**40)]),
)
def test_check_tiling_passes_the_indexes_the_pure_checks_pass(
    sizes: list[int], block_size: int, damage: tuple[int, int] | None, end_shift: int
) -> None:
    header = ObjectHeader(LEDGER, 0, len(sizes) - 1, b"u" * 16, 1)
    encoder = ObjectEncoder(header, block_size)
    encoder.add_run(0, [bytes([s % 7]) * s for s in sizes])
    index_block = b"".join(encoder.finish()[-2:-1])
    footer = replace(encoder.footer, index_offset=encoder.footer.index_offset + end_shift)
    table = bytearray(index_block[INDEX_HEADER_SIZE:])  # entry records, then block records
    if damage is not None and table:  # a byte flipped anywhere in either table
        table[damage[0] % len(table)] ^= damage[1]
    records, blocks = bytes(table[: 16 * len(sizes)]), bytes(table[16 * len(sizes) :])
    index = ObjectIndex(records, [BlockLocation(*r) for r in _RECORD.iter_unpack(blocks)])
    try:
        _check_tiling_pure(index, footer)
        passes = True
    except MalformedObjectError:
        passes = False
    assert compiled.check_tiling(records, blocks, OBJECT_HEADER_SIZE, footer.index_offset) is passes


@pytest.mark.parametrize(
    "arguments",
    [
        (bytearray(), b"", 64, 64),
        (b"", [], 64, 64),
        (b"x", b"", 64, 64),  # not whole records
        (b"", b"x", 64, 64),
        (b"", b"", -1, 64),
        (b"", b"", 64, 2**62),
        (b"", b"", 64, 65),  # the data region not empty, no blocks
        (_stored((84, 1, 0)), b"", 64, 85),  # an entry, no block
        (_stored((84, 1, 0)), _stored((64, 21, 1)), 64, 85),  # the first block not at 0
        (_stored((84, 1, 0)), _stored((64, 21, 0), (85, 0, 1)), 64, 85),  # an empty block
    ],
)
def test_check_tiling_leaves_what_it_cannot_read_to_the_pure_checks(
    arguments: tuple[Any, ...],
) -> None:
    assert compiled.check_tiling(*arguments) is False


def test_check_tiling_of_no_entries_and_of_one_is_true() -> None:
    assert compiled.check_tiling(b"", b"", 64, 64) is True
    assert compiled.check_tiling(_stored((84, 1, 0)), _stored((64, 21, 0)), 64, 85) is True
