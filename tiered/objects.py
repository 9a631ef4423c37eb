"""Offload objects in a store: writing one as a stream, reading entries back in bounded
requests, and checking one end to end.

The format is ``protocol.offload_object``'s; this module only moves its bytes through an
``ObjectStore``. A reader starts from an ``OffloadRef``: what the ledger's metadata repeats
of the object (its size and where its index is), so reading entries costs one ranged read of
their index records and a few reads of their bodies, with no footer read and no bookie. Every
body is checked against its index CRC before it is handed out.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, fields

import crc32c

from aiobk.protocol.errors import MalformedObjectError, NoSuchObjectError, ObjectStoreError
from aiobk.protocol.limits import MAX_LEDGER_ID
from aiobk.protocol.offload_object import (
    DEFAULT_BLOCK_SIZE,
    FOOTER_SIZE,
    HEADER_SIZE,
    INDEX_RECORD_SIZE,
    BlockLocation,
    EntryLocation,
    ObjectEncoder,
    ObjectFooter,
    ObjectHeader,
    check_block,
    check_body,
    check_footer,
    index_span,
    parse_footer,
    parse_header,
    parse_index,
    parse_locations,
)
from aiobk.tiered.store import ObjectStore

DEFAULT_MAX_READ_BYTES = 8 * 1024 * 1024
_UID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class OffloadRef:
    """What a reader needs to read an offloaded ledger's object, and nothing secret: the
    store's URL without credentials, the key, the ledger's entries and where the index is.
    Plain values, so it pickles (Spark's partitions carry it)."""

    url: str
    key: str
    ledger_id: int
    first_entry: int
    last_entry: int
    size: int
    index_offset: int
    index_length: int
    index_crc: int
    digest_type: int

    @classmethod
    def of(cls, url: str, key: str, header: ObjectHeader, footer: ObjectFooter) -> OffloadRef:
        """The ref of the object written with ``header`` and finished with ``footer``."""
        return cls(
            url, key, header.ledger_id, header.first_entry, header.last_entry,
            footer.object_length, footer.index_offset, footer.index_length, footer.index_crc,
            header.digest_type,
        )  # fmt: skip

    @property
    def footer(self) -> ObjectFooter:
        """The footer the object ends with, as the ref repeats it."""
        return ObjectFooter(
            self.index_offset, self.index_length, self.ledger_id,
            self.last_entry - self.first_entry + 1, self.size, self.index_crc,
        )  # fmt: skip


def ledger_prefix(ledger_id: int) -> str:
    """The prefix every object of ``ledger_id`` is under: ``ledgers/<ledger id, 19 digits>/``."""
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise ValueError(f"ledger id {ledger_id} is out of range")
    return f"ledgers/{ledger_id:019d}/"


def object_key(ledger_id: int, uid: str) -> str:
    """The key of a ledger's object written by the offload attempt ``uid`` (32 hex digits):
    ``ledgers/<ledger id, 19 digits>/<uid>.aobk``, so keys sort by ledger."""
    if not _UID.fullmatch(uid):
        raise ValueError(f"uid {uid!r} is not 32 lowercase hex digits")
    return f"{ledger_prefix(ledger_id)}{uid}.aobk"


async def write_object(
    store: ObjectStore,
    key: str,
    header: ObjectHeader,
    runs: AsyncIterable[Sequence[bytes]],
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> ObjectFooter:
    """Stream ``runs`` (the bodies of every entry of the header's range, in order, a run of
    them at a time) into the object ``key``, a block at a time; the footer once the store
    holds it all. Too many bodies are a ``ValueError`` and leave no object."""
    encoder = ObjectEncoder(header, block_size)

    async def chunks() -> AsyncIterator[bytes | bytearray]:
        next_id = header.first_entry
        async for run in runs:
            for chunk in encoder.add_run(next_id, run):
                yield chunk
            next_id += len(run)
        for chunk in encoder.finish():
            yield chunk

    size = await store.put(key, chunks())
    footer = encoder.footer
    if size != footer.object_length:
        raise ObjectStoreError(
            f"{store.url}: stored {size} bytes of {key!r} where {footer.object_length} were written"
        )
    return footer


def _mismatch(key: str, found: ObjectFooter, expected: ObjectFooter) -> MalformedObjectError | None:
    """The first field where the footer ``found`` differs from the one ``expected``."""
    for field in fields(found):
        got, want = getattr(found, field.name), getattr(expected, field.name)
        if got != want:
            return MalformedObjectError(
                f"offload object {key!r}: {field.name} is {got} where the ref says {want}"
            )
    return None


def _groups(items: Sequence[EntryLocation | BlockLocation], limit: int) -> Iterator[range]:
    """Runs of neighbouring items, each spanning at most ``limit`` bytes of the object; an
    item longer than ``limit`` is a run of its own."""
    start = 0
    for position, item in enumerate(items):
        if position > start and item.offset + item.length - items[start].offset > limit:
            yield range(start, position)
            start = position
    if start < len(items):
        yield range(start, len(items))


class ObjectReader:
    """Reads the entries of one offloaded ledger from its object, no more than
    ``max_read_bytes`` per request (one body longer than that is read alone)."""

    def __init__(
        self, store: ObjectStore, ref: OffloadRef, *, max_read_bytes: int = DEFAULT_MAX_READ_BYTES
    ) -> None:
        if max_read_bytes < 1:
            raise ValueError(f"max_read_bytes {max_read_bytes} is not positive")
        self._store = store
        self._ref = ref
        self._limit = max_read_bytes

    @property
    def ref(self) -> OffloadRef:
        return self._ref

    async def read_footer(self) -> ObjectFooter:
        """The object's footer, read from its end and checked against the ref (and the
        object's size against the ref's: a shorter or longer object is not the one named)."""
        key = self._ref.key
        size = await self._store.size(key)
        if size is None:
            raise NoSuchObjectError(f"{self._store.url}: no object {key!r}")
        if size != self._ref.size or size < HEADER_SIZE + FOOTER_SIZE:
            raise MalformedObjectError(
                f"offload object {key!r}: {size} bytes where the ref says {self._ref.size}"
            )
        footer = parse_footer(await self._store.get_range(key, size - FOOTER_SIZE, FOOTER_SIZE))
        error = _mismatch(key, footer, self._ref.footer)
        if error is not None:
            raise error
        return footer

    async def read_header(self) -> ObjectHeader:
        """The object's header, checked against the ref."""
        key = self._ref.key
        header = parse_header(await self._store.get_range(key, 0, HEADER_SIZE))
        check_footer(header, self._ref.footer)
        if header.digest_type != self._ref.digest_type:
            raise MalformedObjectError(
                f"offload object {key!r}: digest type {header.digest_type} where the ref "
                f"says {self._ref.digest_type}"
            )
        return header

    def bodies(self, first: int, last: int) -> AsyncIterator[tuple[int, bytes]]:
        """(entry id, body) for entries ``first..last`` in order, each body's CRC checked;
        ``first = last + 1`` reads nothing. Ids outside the ledger are a ``ValueError``, raised
        here rather than at the first step."""
        index_span(self._ref.footer, first - self._ref.first_entry, last - self._ref.first_entry)
        return self._bodies(first, last)

    async def _bodies(self, first: int, last: int) -> AsyncIterator[tuple[int, bytes]]:
        per_read = max(1, self._limit // INDEX_RECORD_SIZE)  # index records per request
        for start in range(first, last + 1, per_read):
            end = min(last, start + per_read - 1)
            locations = await self._locations(start, end)
            for run in _groups(locations, self._limit):
                bodies = await self._fetch([locations[i] for i in run])
                for i, body in zip(run, bodies, strict=True):
                    yield start + i, check_body(start + i, locations[i], body)

    async def _locations(self, first: int, last: int) -> list[EntryLocation]:
        base = self._ref.first_entry
        offset, length = index_span(self._ref.footer, first - base, last - base)
        data = await self._store.get_range(self._ref.key, offset, length)
        return parse_locations(data, last - first + 1, self._ref.index_offset)

    async def _fetch(self, locations: Sequence[EntryLocation]) -> list[bytes]:
        """The bodies at ``locations`` in one request; an empty body needs no bytes."""
        ranges = [(where.offset, where.length) for where in locations if where.length]
        got = iter(await self._store.get_ranges(self._ref.key, ranges) if ranges else ())
        return [next(got) if where.length else b"" for where in locations]


async def verify_object(
    store: ObjectStore,
    ref: OffloadRef,
    expected_crcs: Sequence[int] | None = None,
    *,
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
) -> None:
    """Read the whole object back and check every part of it: its size, footer and header
    against the ref, its index against the ref's CRC (and each entry's CRC against
    ``expected_crcs``, the CRCs of the bodies as they were read for the copy, when given),
    every block's header and every body. ``MalformedObjectError`` names the first mismatch;
    ``NoSuchObjectError`` when there is no object."""
    reader = ObjectReader(store, ref, max_read_bytes=max_read_bytes)
    footer = await reader.read_footer()
    await reader.read_header()
    parts = [
        await store.get_range(
            ref.key, footer.index_offset + start, min(max_read_bytes, footer.index_length - start)
        )
        for start in range(0, footer.index_length, max_read_bytes)
    ]
    data = b"".join(parts)
    crc = int(crc32c.crc32c(data))
    if crc != ref.index_crc:
        raise MalformedObjectError(
            f"offload object {ref.key!r}: index CRC32C {crc:#010x} is not the ref's "
            f"{ref.index_crc:#010x}"
        )
    index = parse_index(footer, data)
    if expected_crcs is not None:
        _check_crcs(ref, [location.crc for location in index.locations], expected_crcs)
    for run in _groups(index.blocks, max_read_bytes):
        blocks = [index.blocks[number] for number in run]
        ranges = [(block.offset, block.length) for block in blocks]
        for number, block_data in zip(run, await store.get_ranges(ref.key, ranges), strict=True):
            check_block(block_data, index, number)


def _check_crcs(ref: OffloadRef, crcs: Sequence[int], expected: Sequence[int]) -> None:
    if len(expected) != len(crcs):
        raise MalformedObjectError(
            f"offload object {ref.key!r}: {len(crcs)} entries, {len(expected)} expected"
        )
    for entry, (got, want) in enumerate(zip(crcs, expected, strict=True)):
        if got != want:
            raise MalformedObjectError(
                f"offload object {ref.key!r}: entry {ref.first_entry + entry}'s CRC32C "
                f"{got:#010x} is not the {want:#010x} read for the copy"
            )


__all__ = [
    "DEFAULT_MAX_READ_BYTES",
    "ObjectReader",
    "OffloadRef",
    "ledger_prefix",
    "object_key",
    "verify_object",
    "write_object",
]
