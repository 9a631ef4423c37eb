"""Journal record format and group-commit policy: pure, no disk."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.bookie.journal.format import (
    FILE_HEADER,
    RECORD_HEADER,
    JournalCorruptError,
    RecordType,
    Stop,
    add_payload,
    decode_file_header,
    encode_adds,
    encode_file_header,
    encode_record,
    padding,
    scan,
    valid_record_after,
)
from aiobk.bookie.journal.policy import (
    INLINE_BYTES,
    INLINE_WRITE_BYTES,
    JOURNAL_ALIGNMENT,
    BatchPlan,
    GroupCommitPolicy,
    batch_plan,
)


def test_policy_flushes_at_once_when_queue_empty_is_set() -> None:
    policy = GroupCommitPolicy(0.002, 1024, flush_when_queue_empty=True)
    assert policy.flush_delay(0, 0.0, 5.0) is None
    assert policy.flush_delay(10, 5.0, 5.0) == 0.0


def test_policy_waits_for_the_group_or_the_threshold() -> None:
    policy = GroupCommitPolicy(0.002, 1024, flush_when_queue_empty=False)
    assert policy.flush_delay(10, 5.0, 5.0) == pytest.approx(0.002)
    assert policy.flush_delay(10, 5.0, 5.0015) == pytest.approx(0.0005)
    assert policy.flush_delay(10, 5.0, 5.01) == 0.0  # oldest waited long enough
    assert policy.flush_delay(1024, 5.0, 5.0) == 0.0  # enough bytes buffered


records = st.lists(
    st.tuples(st.sampled_from(list(RecordType)), st.binary(max_size=64)), max_size=12
)


@given(records, st.integers(0, 2**40))
def test_records_round_trip(items: list[tuple[RecordType, bytes]], first: int) -> None:
    data = b"".join(encode_record(k, first + i, p) for i, (k, p) in enumerate(items))
    parsed, stop, why = scan(data)
    assert why is Stop.END
    assert stop == len(data)
    assert [(r.kind, r.lsn, r.payload) for r in parsed] == [
        (k, first + i, p) for i, (k, p) in enumerate(items)
    ]


def test_scan_tells_incomplete_from_invalid() -> None:
    one = encode_record(RecordType.ADD, 1, b"a" * 20)
    two = encode_record(RecordType.FENCE, 2, b"b" * 8)
    parsed, stop, why = scan(one + two[:-3])
    assert (len(parsed), stop, why) == (1, len(one), Stop.INCOMPLETE)
    parsed, stop, why = scan(one + two[:5])
    assert why is Stop.INCOMPLETE
    damaged = bytearray(one + two)
    damaged[len(one) + 25] ^= 0xFF  # inside the second record's payload
    parsed, stop, why = scan(bytes(damaged))
    assert (len(parsed), stop, why) == (1, len(one), Stop.INVALID)
    assert scan(b"\x00" * 40)[2] is Stop.INVALID  # no magic
    bad_type = bytearray(encode_record(RecordType.ADD, 3, b""))
    bad_type[2] = 99
    assert scan(bytes(bad_type))[2] is Stop.INVALID


def test_valid_record_after_separates_torn_tail_from_corruption() -> None:
    one = encode_record(RecordType.ADD, 1, b"a" * 20)
    two = encode_record(RecordType.ADD, 2, b"b" * 20)
    torn = one + b"\xb0\x0c" + b"\x00" * 30
    assert valid_record_after(torn, len(one)) is None
    damaged = bytearray(one + two)
    damaged[5] ^= 0x01
    assert valid_record_after(bytes(damaged), 0) == len(one)


def test_file_header() -> None:
    header = encode_file_header(77)
    assert decode_file_header(header) == 77
    with pytest.raises(JournalCorruptError, match="shorter"):
        decode_file_header(header[:5])
    with pytest.raises(JournalCorruptError, match="damaged"):
        decode_file_header(b"X" + header[1:])


@given(st.integers(0, 10**7), st.sampled_from([512, 4096]))
def test_padding_aligns_and_scans_as_a_record(position: int, alignment: int) -> None:
    pad = padding(position, alignment)
    assert (position + len(pad)) % alignment == 0
    if pad:
        records, _stop, why = scan(pad)
        assert why is Stop.END
        assert [r.kind for r in records] == [RecordType.PADDING]


def test_lone_1_kib_adds_take_three_sectors_each_not_a_page() -> None:
    """At low load every add is a group commit of its own. Padded to the default alignment, a
    1 KiB add (1,059 bytes with its headers) takes 1.5 KiB of journal -- padded to a 4 KiB
    page it took 4 KiB, 4x its payload."""
    position = FILE_HEADER.size
    sizes = []
    for entry in range(16):
        data = encode_adds(entry, 1, [(entry, bytes(1024))])
        assert len(data) == 1059
        data += padding(position + len(data), JOURNAL_ALIGNMENT)
        sizes.append(len(data))
        position += len(data)
    assert sizes == [1536 - FILE_HEADER.size] + [1536] * 15
    assert position % 512 == 0


@given(st.integers(FILE_HEADER.size, 10**7), st.integers(1, 1 << 20))
def test_default_padding_costs_less_than_a_sector_and_a_header(position: int, size: int) -> None:
    pad = padding(position + size, JOURNAL_ALIGNMENT)
    assert len(pad) < 512 + RECORD_HEADER.size
    assert (position + size + len(pad)) % 512 == 0


def _plan(records: int = 1, volatile: int = 0, size: int = 4096, **kw: object) -> BatchPlan:
    settings: dict[str, object] = {"sync_data": True, "sync_busy": False, "inline_records": 1}
    settings.update(kw)
    return batch_plan(records, volatile, size, **settings)  # type: ignore[arg-type]


def test_an_idle_lone_persistent_record_is_synced_where_it_is() -> None:
    assert _plan() is BatchPlan.SYNC_HERE
    assert _plan(size=INLINE_BYTES) is BatchPlan.SYNC_HERE


def test_load_a_big_record_or_a_sync_under_way_go_to_the_io_lane() -> None:
    assert _plan(records=2) is BatchPlan.OFFLOAD  # more than inline_records
    assert _plan(records=2, inline_records=4) is BatchPlan.SYNC_HERE
    assert _plan(size=INLINE_BYTES + 1) is BatchPlan.OFFLOAD
    assert _plan(sync_busy=True) is BatchPlan.OFFLOAD  # overlap with the sync stage instead
    assert _plan(sync_data=False) is BatchPlan.OFFLOAD  # nothing to sync here


def test_volatile_batches_are_written_at_once_and_never_synced_inline() -> None:
    assert _plan(records=2, volatile=1) is BatchPlan.WRITE_HERE
    assert _plan(records=1, volatile=1, inline_records=4) is BatchPlan.WRITE_HERE
    assert _plan(records=300, volatile=300, size=INLINE_WRITE_BYTES) is BatchPlan.WRITE_HERE
    assert _plan(records=300, volatile=1, size=INLINE_WRITE_BYTES) is BatchPlan.WRITE_HERE
    assert _plan(records=300, volatile=300, size=INLINE_WRITE_BYTES + 1) is BatchPlan.OFFLOAD


def test_without_room_or_after_a_slow_write_everything_goes_to_the_io_lane() -> None:
    assert _plan(write_here=False) is BatchPlan.OFFLOAD  # not even a lone idle record
    assert _plan(records=2, volatile=1, write_here=False) is BatchPlan.OFFLOAD


@given(
    st.integers(0, 2**40),
    st.integers(0, 2**62),
    st.lists(st.tuples(st.integers(0, 2**62), st.binary(max_size=300)), max_size=20),
)
def test_an_add_batch_encodes_as_its_records_one_by_one(
    first_lsn: int, ledger_id: int, entries: list[tuple[int, bytes]]
) -> None:
    """``encode_adds`` (ADD_BATCH's journal path) is byte for byte the ADD records ``append``
    writes for each entry: replay reads no new format."""
    expected = b"".join(
        encode_record(RecordType.ADD, first_lsn + i, add_payload(ledger_id, entry_id, body))
        for i, (entry_id, body) in enumerate(entries)
    )
    assert encode_adds(first_lsn, ledger_id, entries) == expected
