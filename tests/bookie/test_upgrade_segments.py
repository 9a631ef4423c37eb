"""The index segment codec and sparse pages (pure: no disk)."""

from __future__ import annotations

import struct
import tracemalloc

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiobk.bookie.ledger_state import MAX_KEY_SIZE
from aiobk.bookie.upgrade.segments import (
    CRC,
    HEADER,
    LEDGER,
    LEDGER_TAIL,
    MAGIC,
    PAGE_HEAD_V1,
    PAGE_SIZE,
    SPARSE_MAX,
    IndexCorruptError,
    Loaded,
    decode_segment,
    encode_segment,
)
from aiobk.bookie.upgrade.segments import PagedLedger as LedgerState
from aiobk.protocol import MASTER_KEY_SIZE, MAX_ENTRY_ID, MAX_LEDGER_ID

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _state(ledger_id: int, key: bytes, entries: dict[int, int], lac: int = -1) -> LedgerState:
    state = LedgerState(ledger_id, key)
    for entry_id, location in entries.items():
        state.set_location(entry_id, location)
    state.lac = lac
    return state


def _same(a: LedgerState, b: LedgerState) -> None:
    assert (a.ledger_id, a.master_key, a.fenced, a.limbo, a.lac, a.max_entry) == (
        b.ledger_id,
        b.master_key,
        b.fenced,
        b.limbo,
        b.lac,
        b.max_entry,
    )
    assert set(a.pages) == set(b.pages)
    for number in a.pages:
        for slot in range(0, PAGE_SIZE, 97):
            entry = (number << 12) + slot
            assert a.location(entry) == b.location(entry)


ledgers = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=MAX_LEDGER_ID),
        st.binary(min_size=0, max_size=MASTER_KEY_SIZE),
        st.dictionaries(
            st.integers(min_value=0, max_value=MAX_ENTRY_ID),
            st.integers(min_value=0, max_value=2**63 - 1),
            max_size=20,
        ),
        INT64,
        st.booleans(),
        st.booleans(),
    ),
    max_size=6,
    unique_by=lambda t: t[0],
)


@settings(max_examples=150, deadline=None)
@given(ledgers, st.sets(st.integers(min_value=0, max_value=MAX_LEDGER_ID), max_size=10), INT64)
def test_every_state_the_protocol_admits_encodes_and_reads_back(
    specs: list[tuple[int, bytes, dict[int, int], int, bool, bool]], deleted: set[int], mark: int
) -> None:
    """No request may brick a bookie: an entry id >= 2**44 or a key over 255 bytes made the
    encoder raise after the add was acknowledged, and the bookie never checkpointed again."""
    states = []
    for ledger_id, key, entries, lac, fenced, limbo in specs:
        state = _state(ledger_id, key, entries, lac)
        state.fenced, state.limbo = fenced, limbo
        states.append(state)
    data, count = encode_segment(3, True, mark, states, deleted)
    assert count == len(states)
    loaded = Loaded()
    assert decode_segment(data, loaded) == (1, 3)
    assert loaded.mark == mark
    assert loaded.deleted == deleted
    assert set(loaded.ledgers) == {s.ledger_id for s in states}
    for state in states:
        _same(state, loaded.ledgers[state.ledger_id])


def test_a_far_entry_costs_a_small_sparse_page_not_32_kib() -> None:
    """Each add at a far entry id used to allocate a whole 4,096-slot page."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = LedgerState(1, b"k" * 32)
    for i in range(3000):
        state.set_location(i * 10_000_000, 1 << 40 | i)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 3000 * 600, grown  # was 3000 x 32 KiB = 94 MiB
    data, _ = encode_segment(1, True, 0, [state])
    assert len(data) < 3000 * 40, len(data)  # was 94 MiB on disk
    loaded = Loaded()
    decode_segment(data, loaded)
    assert loaded.ledgers[1].location(2999 * 10_000_000) == 1 << 40 | 2999


def test_a_page_turns_dense_once_it_fills_and_reads_the_same() -> None:
    state = LedgerState(1, b"")
    for entry in range(SPARSE_MAX - 1):
        state.set_location(entry, entry + 100)
    assert isinstance(state.pages[0], dict)
    state.set_location(SPARSE_MAX - 1, 7)
    assert not isinstance(state.pages[0], dict)
    assert [state.location(e) for e in (0, SPARSE_MAX - 2, SPARSE_MAX - 1, SPARSE_MAX)] == [
        100,
        SPARSE_MAX - 2 + 100,
        7,
        -1,
    ]
    loaded = Loaded()
    decode_segment(encode_segment(1, True, 0, [state])[0], loaded)
    _same(state, loaded.ledgers[1])


def test_a_key_storage_cannot_hold_is_refused_when_the_state_is_made() -> None:
    with pytest.raises(ValueError, match="master key"):
        LedgerState(1, b"k" * (MAX_KEY_SIZE + 1))


def _v1_segment(ledger_id: int, key: bytes, page: list[int]) -> bytes:
    """A version-1 segment as the previous release wrote it (dense pages, u32 numbers)."""
    body = HEADER.pack(MAGIC, 1, 1, 1, 42, 1)
    body += LEDGER.pack(ledger_id, 1, len(key)) + key + LEDGER_TAIL.pack(5, 2, 1)
    body += PAGE_HEAD_V1.pack(0) + struct.pack(f"<{PAGE_SIZE}q", *page)
    return body + CRC.pack(crc32c.crc32c(body))


def test_a_version_1_segment_still_loads() -> None:
    page = [-1] * PAGE_SIZE
    page[0], page[2] = 11, 22
    loaded = Loaded()
    assert decode_segment(_v1_segment(9, b"k" * 32, page), loaded) == (1, 1)
    state = loaded.ledgers[9]
    assert (loaded.mark, state.fenced, state.lac, state.max_entry) == (42, True, 5, 2)
    assert [state.location(e) for e in range(3)] == [11, -1, 22]
    assert loaded.deleted == set()


@pytest.mark.parametrize("cut", [1, 5, 20, 300])
def test_a_truncated_or_damaged_segment_is_refused(cut: int) -> None:
    state = _state(1, b"k" * 32, {0: 5, 10**12: 6})
    data = encode_segment(1, True, 0, [state], {4, 5})[0]
    body = data[: -CRC.size - cut]
    with pytest.raises(IndexCorruptError):
        decode_segment(body + CRC.pack(crc32c.crc32c(body)), Loaded())
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    with pytest.raises(IndexCorruptError, match="checksum"):
        decode_segment(bytes(flipped), Loaded())


def test_a_delta_segment_carries_no_deleted_list_and_keeps_the_full_ones() -> None:
    full = encode_segment(1, True, 0, [_state(1, b"", {0: 1})], {7})[0]
    delta = encode_segment(2, False, 5, [_state(2, b"", {0: 2})], {8})[0]
    loaded = Loaded()
    decode_segment(full, loaded)
    decode_segment(delta, loaded)
    assert loaded.deleted == {7}
    assert set(loaded.ledgers) == {1, 2}
