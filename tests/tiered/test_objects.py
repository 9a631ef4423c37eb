"""Offload objects in a store (tiered.objects): written as a stream, read back in bounded
requests with every body checked, verified end to end, and refused when damaged."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from dataclasses import replace

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.protocol.errors import MalformedObjectError, NoSuchObjectError, ObjectStoreError
from aiobk.protocol.offload_object import ObjectHeader, parse_object
from aiobk.tiered import (
    MemoryObjectStore,
    ObjectReader,
    OffloadRef,
    object_key,
    verify_object,
    write_object,
)

UID = "0123456789abcdef0123456789abcdef"
KEY = object_key(7, UID)


class CountingStore(MemoryObjectStore):
    """The memory store, noting every read: ("range", [(start, length)]) or ("ranges", [...])."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, list[tuple[int, int]]]] = []

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        self.reads.append(("range", [(start, length)]))
        return await super().get_range(key, start, length)

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self.reads.append(("ranges", list(ranges)))
        return [await MemoryObjectStore.get_range(self, key, s, n) for s, n in ranges]


def _bodies(count: int, size: int = 30) -> list[bytes]:
    return [bytes([i % 251]) * (size + i % 7) for i in range(count)]


async def _stream(bodies: Sequence[bytes]) -> AsyncIterator[Sequence[bytes]]:
    """The bodies in runs of 1, 2, 3, ... of them, as a copy hands them over."""
    start, length = 0, 1
    while start < len(bodies):
        yield bodies[start : start + length]
        start, length = start + length, length + 1


def _header(bodies: Sequence[bytes], digest_type: int = 1) -> ObjectHeader:
    return ObjectHeader(7, 0, len(bodies) - 1, bytes.fromhex(UID), digest_type)


async def _write(
    store: MemoryObjectStore, bodies: Sequence[bytes], block_size: int = 200
) -> OffloadRef:
    header = _header(bodies)
    footer = await write_object(store, KEY, header, _stream(bodies), block_size)
    return OffloadRef.of(store.url, KEY, header, footer)


async def _read(reader: ObjectReader, first: int, last: int) -> list[tuple[int, bytes]]:
    return [item async for item in reader.bodies(first, last)]


def test_object_keys_sort_by_ledger_and_name_the_attempt() -> None:
    assert object_key(7, UID) == f"ledgers/0000000000000000007/{UID}.aobk"
    assert object_key(2**63 - 1, UID) == f"ledgers/9223372036854775807/{UID}.aobk"
    for ledger_id, uid, reason in [
        (-1, UID, "ledger id -1"),
        (2**63, UID, "out of range"),
        (7, UID.upper(), "not 32 lowercase hex"),
        (7, UID[:-1], "not 32 lowercase hex"),
        (7, "../" + UID, "not 32 lowercase hex"),
    ]:
        with pytest.raises(ValueError, match=reason):
            object_key(ledger_id, uid)


async def test_an_object_written_as_a_stream_reads_back_whole() -> None:
    store = MemoryObjectStore()
    bodies = _bodies(40)
    ref = await _write(store, bodies)
    assert ref.size == len(store.objects[KEY])
    assert parse_object(store.objects[KEY]) == (_header(bodies), bodies)
    assert pickle.loads(pickle.dumps(ref)) == ref
    assert await _read(ObjectReader(store, ref), 0, 39) == list(enumerate(bodies))
    await verify_object(store, ref, [crc32c.crc32c(body) for body in bodies])
    assert await ObjectReader(store, ref).read_footer() == ref.footer


async def test_more_entries_than_the_header_names_leave_no_object() -> None:
    store = MemoryObjectStore()

    async def too_many() -> AsyncIterator[Sequence[bytes]]:
        yield [b"a", b"b"]
        yield [b"c", b"d"]

    with pytest.raises(ValueError, match=r"entry 3 where entry 2 of 0\.\.2 is next"):
        await write_object(store, KEY, _header([b"a", b"b", b"c"]), too_many())
    assert store.objects == {}
    assert await store.uploads("") == []


async def test_a_store_that_keeps_other_bytes_than_written_fails_the_write() -> None:
    class Short(MemoryObjectStore):
        async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
            return await super().put(key, chunks) - 1

    with pytest.raises(ObjectStoreError, match="stored 212 bytes of"):
        await write_object(Short(), KEY, _header([b"x"]), _stream([b"x"]))


@pytest.mark.parametrize(
    ("first", "last"),
    [(0, 0), (39, 39), (0, 39), (17, 17), (3, 29), (12, 11), (0, -1), (40, 39)],
)
async def test_ranges_at_the_edges_read_back(first: int, last: int) -> None:
    store = CountingStore()
    bodies = _bodies(40)
    ref = await _write(store, bodies, block_size=100)  # a block every two or three entries
    reader = ObjectReader(store, ref, max_read_bytes=120)
    assert await _read(reader, first, last) == list(enumerate(bodies))[first : last + 1]
    if last < first:
        assert store.reads == []  # nothing to read, nothing asked


async def test_one_index_read_then_reads_bounded_by_max_read_bytes() -> None:
    store = CountingStore()
    bodies = [*_bodies(40), b"L" * 2000, *_bodies(5)]  # one body longer than the bound
    ref = await _write(store, bodies, block_size=100)
    reader = ObjectReader(store, ref, max_read_bytes=800)
    assert await _read(reader, 0, 45) == list(enumerate(bodies))
    (kind, index_read), *data_reads = store.reads
    assert kind == "range"
    assert index_read == [(ref.index_offset + 32, 16 * 46)]
    assert {kind for kind, _ in data_reads} == {"ranges"}
    spans: list[int] = []
    for _kind, ranges in data_reads:
        start, end = ranges[0][0], ranges[-1][0] + ranges[-1][1]
        assert end - start <= 800 or ranges == [(ranges[0][0], 2000)]
        spans.append(end - start)
    assert 2000 in spans
    # 40 bodies of 30 to 36 bytes (and their 4-byte prefixes) in three reads, the long body
    # alone, and the five after it in one.
    assert [len(ranges) for _kind, ranges in data_reads] == [18, 18, 4, 1, 5]


async def test_index_records_are_read_in_pieces_no_larger_than_the_bound() -> None:
    store = CountingStore()
    bodies = _bodies(10, size=3)
    ref = await _write(store, bodies)
    assert (
        await _read(ObjectReader(store, ref, max_read_bytes=40), 1, 9)
        == list(enumerate(bodies))[1:]
    )
    index_reads = [spans[0] for kind, spans in store.reads if kind == "range"]
    assert index_reads == [
        *((ref.index_offset + 32 + 16 * i, 32) for i in (1, 3, 5, 7)),
        (ref.index_offset + 32 + 16 * 9, 16),
    ]


async def test_empty_bodies_and_an_empty_ledger_need_no_data_reads() -> None:
    store = CountingStore()
    ref = await _write(store, [b"", b"x", b""])
    assert await _read(ObjectReader(store, ref), 0, 2) == [(0, b""), (1, b"x"), (2, b"")]
    requested = [ranges for kind, ranges in store.reads if kind == "ranges"]
    assert len(requested) == 1
    assert [length for _start, length in requested[0]] == [1]  # the empty bodies are not asked
    empty_store = CountingStore()
    empty = await _write(empty_store, [])
    assert (empty.first_entry, empty.last_entry) == (0, -1)
    assert await _read(ObjectReader(empty_store, empty), 0, -1) == []
    await verify_object(empty_store, empty, [])
    assert [kind for kind, _ in empty_store.reads] == ["range", "range", "range"]


async def test_ids_outside_the_ledger_are_refused_at_once() -> None:
    store = MemoryObjectStore()
    reader = ObjectReader(store, await _write(store, _bodies(5)))
    for first, last in [(-1, 2), (0, 5), (3, 1), (6, 5)]:
        with pytest.raises(ValueError, match=r"not in ledger 7's 0\.\.4"):
            reader.bodies(first, last)
    with pytest.raises(ValueError, match="max_read_bytes 0"):
        ObjectReader(store, reader.ref, max_read_bytes=0)


async def test_a_damaged_body_in_the_store_is_refused() -> None:
    store = MemoryObjectStore()
    bodies = _bodies(12)
    ref = await _write(store, bodies)
    reader = ObjectReader(store, ref)
    location = [item async for item in reader.bodies(5, 5)]
    assert location == [(5, bodies[5])]
    data = bytearray(store.objects[KEY])
    at = data.index(bodies[5])
    data[at + 3] ^= 0x40
    store.objects[KEY] = bytes(data)
    assert await _read(reader, 0, 4) == list(enumerate(bodies))[:5]
    with pytest.raises(MalformedObjectError, match="entry 5: CRC32C"):
        await _read(reader, 0, 11)
    with pytest.raises(MalformedObjectError, match="entry 5: CRC32C"):
        await verify_object(store, ref)


async def test_damage_only_verification_reads_is_refused_by_it() -> None:
    store = MemoryObjectStore()
    bodies = _bodies(12)
    ref = await _write(store, bodies)
    clean = store.objects[KEY]
    for at, reason in [
        (64, "block 0 says b'BBLK'"),  # a block's magic: readers skip it, verification not
        (1, "magic"),  # the header
        (ref.index_offset + 1, "index CRC32C"),
        (ref.size - 20, "footer CRC32C"),
    ]:
        data = bytearray(clean)
        data[at] ^= 0x03
        store.objects[KEY] = bytes(data)
        with pytest.raises(MalformedObjectError, match=reason):
            await verify_object(store, ref)
    store.objects[KEY] = clean
    await verify_object(store, ref)


async def test_an_index_record_pointing_outside_the_data_is_refused() -> None:
    store = MemoryObjectStore()
    ref = await _write(store, _bodies(4))
    data = bytearray(store.objects[KEY])
    record = ref.index_offset + 32 + 16 * 2
    data[record : record + 8] = (ref.index_offset - 10).to_bytes(8, "big")
    store.objects[KEY] = bytes(data)
    with pytest.raises(MalformedObjectError, match="outside the data blocks"):
        await _read(ObjectReader(store, ref), 0, 3)


async def test_a_ref_that_is_not_the_object_s_is_refused() -> None:
    store = MemoryObjectStore()
    bodies = _bodies(6)
    ref = await _write(store, bodies)
    wrong_crc = replace(ref, index_crc=ref.index_crc ^ 1)
    with pytest.raises(MalformedObjectError, match="index_crc is"):
        await ObjectReader(store, wrong_crc).read_footer()
    with pytest.raises(MalformedObjectError, match="index_crc is"):
        await verify_object(store, wrong_crc)
    wrong_size = replace(ref, size=ref.size + 1)
    with pytest.raises(MalformedObjectError, match=f"{ref.size} bytes where the ref says"):
        await verify_object(store, wrong_size)
    wrong_digest = replace(ref, digest_type=2)
    with pytest.raises(MalformedObjectError, match="digest type 1 where the ref says 2"):
        await verify_object(store, wrong_digest)
    fewer = replace(ref, last_entry=4)
    with pytest.raises(MalformedObjectError, match="entry_count is 6 where the ref says 5"):
        await verify_object(store, fewer)


async def test_verification_compares_the_crcs_read_for_the_copy() -> None:
    store = MemoryObjectStore()
    bodies = _bodies(6)
    ref = await _write(store, bodies)
    crcs = [crc32c.crc32c(body) for body in bodies]
    await verify_object(store, ref, crcs, max_read_bytes=64)
    with pytest.raises(MalformedObjectError, match="6 entries, 5 expected"):
        await verify_object(store, ref, crcs[:5])
    crcs[3] ^= 1
    with pytest.raises(MalformedObjectError, match=r"entry 3's CRC32C .* read for the copy"):
        await verify_object(store, ref, crcs)


async def test_a_missing_object_is_no_such_object() -> None:
    store = MemoryObjectStore()
    ref = await _write(store, _bodies(3))
    await store.delete(KEY)
    reader = ObjectReader(store, ref)
    with pytest.raises(NoSuchObjectError):
        await _read(reader, 0, 2)
    with pytest.raises(NoSuchObjectError):
        await reader.read_footer()
    with pytest.raises(NoSuchObjectError):
        await verify_object(store, ref)


@given(
    st.lists(st.binary(max_size=90), max_size=30),
    st.integers(1, 300),
    st.integers(1, 400),
    st.data(),
)
def test_any_ledger_reads_back_in_any_range(
    bodies: list[bytes], block_size: int, max_read_bytes: int, data: st.DataObject
) -> None:
    first = data.draw(st.integers(0, len(bodies)))
    last = data.draw(st.integers(first - 1, len(bodies) - 1))

    async def run() -> None:
        store = CountingStore()
        ref = await _write(store, bodies, block_size)
        got = await _read(ObjectReader(store, ref, max_read_bytes=max_read_bytes), first, last)
        assert got == list(enumerate(bodies))[first : last + 1]
        for kind, ranges in store.reads:
            if kind == "ranges":
                span = ranges[-1][0] + ranges[-1][1] - ranges[0][0]
                assert span <= max_read_bytes or len(ranges) == 1
        await verify_object(store, ref, [crc32c.crc32c(b) for b in bodies], max_read_bytes=64)

    asyncio.run(run())
