"""Bulk reads of a ledger's entries in runs: one READ_RANGE (protocol 3) per run of consecutive
entries instead of one READ per entry -- what a copy of a whole closed ledger (an offload) reads.
The entry bodies come out as the bookies served them, checked but not parsed: a copy keeps the
bytes, so they are neither taken apart nor packed again.

Theory of operation. A run can come from one bookie only if that bookie holds every entry of
it: a ledger whose ensemble size equals its write quorum, the common case, where every bookie
of a fragment holds all the fragment's entries. A striped ledger (ensemble larger than its write
quorum) is read entry by entry (``EntryReader``), and so is a fragment none of whose bookies
agreed to protocol 3 (an older release's).

The range ``first..last`` is cut into chunks of consecutive entries, each sized to about
``RANGE_BYTES`` of bodies by the largest entry seen, and a window of chunks is fetched ahead of
the consumer, bounded by ``read_ahead_bytes`` as ``EntryReader``'s window is; the first chunk is
whatever one answer holds, to learn the entries' size. A chunk asks the bookies of its fragment
in read order (``BookiePool.read_order``; one that failed a run of this reader, last) and takes
the first answer with a body; a bookie's answer is a prefix of what was asked (its byte and
entry caps, an entry it lacks), so the chunk asks again from where the answer ended until the
chunk is complete. Every body is checked as a READ's is (``Digester.check_body``), its ids
against the place it holds in the run; a damaged body ends that answer before it. When no bookie
answers with a body -- down, EIO, a missing entry, a digest that fails -- the entry is read
through ``EntryReader.fetch``, whose speculative reads over the write set find a good copy or
say why there is none, and the chunk goes on in runs from the entry after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from typing import Final

from aiobk.client.digest import Digester
from aiobk.client.pool import BookiePool
from aiobk.client.read import EntryReader
from aiobk.client.run_check import check_run
from aiobk.client.stats import ClientStats
from aiobk.metadata import LedgerMetadata
from aiobk.protocol import (
    MAX_BATCH_ENTRIES,
    MAX_ENTRY_ID,
    BatchError,
    EntryBody,
    ReadRangeRequest,
    ReadRangeResponse,
    StatusCode,
    pack_entry,
    unpack_range,
)
from aiobk.protocol.errors import BKError, DigestMismatchError
from aiobk.tasks import cancel_all

# Body bytes one READ_RANGE asks for: large enough that a request's round trip is a small part
# of moving its bytes, small enough to stay well inside a response frame (5 MiB by default).
RANGE_BYTES: Final = 1024 * 1024
RANGE_VERSION: Final = 3  # the protocol version that brought READ_RANGE


class RangeReader:
    """A ledger's checked entry bodies in runs (see the module docstring)."""

    def __init__(
        self,
        entries: EntryReader,
        digest: Digester,
        pool: BookiePool,
        read_timeout: float,
        read_ahead_bytes: int,
        stats: ClientStats,
    ) -> None:
        self._entries = entries
        self._ledger_id = entries.ledger_id
        self._digest = digest
        self._pool = pool
        self._timeout = read_timeout
        self._ahead = read_ahead_bytes
        self._stats = stats
        # Bookies that failed a run of this reader (an error, a timeout, a damaged body): asked
        # last from then on, so a bookie that hangs costs one timeout, not one per run.
        self._failed: set[str] = set()

    async def bodies(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> AsyncGenerator[bytes, None]:
        """The bodies of entries ``first``..``last`` as served, checked, in order."""
        async with contextlib.aclosing(self.runs(metadata, first, last)) as runs:
            async for run in runs:
                for raw in run:
                    yield raw

    async def runs(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> AsyncGenerator[list[bytes], None]:
        """``bodies`` a run at a time: lists of consecutive bodies, from ``first`` on, none empty
        (a copy moves them a run at a time, not an entry at a time)."""
        if metadata.ensemble_size != metadata.write_quorum:
            async for run in self._by_entry(metadata, first, last):
                yield run
            return
        if first > last:
            return
        head = await self._head(metadata, first, last)
        if head is None:  # the first fragment's bookies read no runs: entry by entry
            async for run in self._by_entry(metadata, first, last):
                yield run
            return
        yield head
        seen, seen_bytes = len(head), sum(map(len, head))
        window = max(1, self._ahead // RANGE_BYTES)  # chunks of about RANGE_BYTES each
        # In entry order: each chunk's task and the entries it was asked for.
        chunks: deque[tuple[asyncio.Task[list[bytes]], int, int]] = deque()
        next_id = first + len(head)
        try:
            while chunks or next_id <= last:
                count = max(1, min(MAX_BATCH_ENTRIES, RANGE_BYTES * seen // max(1, seen_bytes)))
                while next_id <= last and len(chunks) < window:
                    end = min(last, next_id + count - 1)
                    task = asyncio.ensure_future(self._chunk(metadata, next_id, end))
                    chunks.append((task, next_id, end))
                    next_id = end + 1
                task, start, end = chunks.popleft()
                chunk = await task
                seen += len(chunk)
                seen_bytes += sum(map(len, chunk))
                yield chunk
                rest = start + len(chunk)
                if rest <= end:  # the chunk's bytes ran out first: the rest of it comes next
                    task = asyncio.ensure_future(self._chunk(metadata, rest, end))
                    chunks.appendleft((task, rest, end))
        finally:
            await cancel_all([task for task, _start, _end in chunks])

    async def _by_entry(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> AsyncGenerator[list[bytes], None]:
        """Entries read a READ each (``EntryReader``'s window ahead), in runs of about
        ``RANGE_BYTES``."""
        run: list[bytes] = []
        size = 0
        async with contextlib.aclosing(self._entries.iter_bodies(metadata, first, last)) as read:
            async for body in read:
                run.append(_packed(body))
                size += len(run[-1])
                if size >= RANGE_BYTES:
                    yield run
                    run, size = [], 0
        if run:
            yield run

    async def _head(self, metadata: LedgerMetadata, first: int, last: int) -> list[bytes] | None:
        """Entry ``first`` and as many after it as one answer holds; None when the bookies
        of its fragment read no runs."""
        return await self._next_run(metadata, first, min(last, _fragment_end(metadata, first)))

    async def _chunk(self, metadata: LedgerMetadata, first: int, last: int) -> list[bytes]:
        """Entries from ``first`` on, up to ``last``, in as many runs as it takes, until
        their bodies reach ``RANGE_BYTES`` (a chunk ends early when its entries are larger
        than the ones seen before it)."""
        bodies: list[bytes] = []
        size = 0
        at = first
        while at <= last and size < RANGE_BYTES:
            end = min(last, _fragment_end(metadata, at))
            run = await self._next_run(metadata, at, end)
            if run is None:  # no bookie of the fragment reads runs: entry by entry
                run = await self._one_by_one(metadata, at, end, RANGE_BYTES - size)
            bodies.extend(run)
            size += sum(map(len, run))
            at += len(run)
        return bodies

    async def _one_by_one(
        self, metadata: LedgerMetadata, first: int, last: int, budget: int
    ) -> list[bytes]:
        """Entries ``first``..``last`` read a READ each, until their bodies reach ``budget``."""
        bodies: list[bytes] = []
        size = 0
        async with contextlib.aclosing(self._entries.iter_bodies(metadata, first, last)) as read:
            async for body in read:
                bodies.append(_packed(body))
                size += len(bodies[-1])
                if size >= budget:
                    break
        return bodies

    async def _next_run(
        self, metadata: LedgerMetadata, first: int, last: int
    ) -> list[bytes] | None:
        """A run from ``first`` within one fragment: one bookie's answer, or entry ``first``
        alone read as a READ reads it when no bookie answered with a body; None when no bookie
        of the fragment reads runs."""
        run = await self._run(metadata.fragment_for(first).ensemble, first, last)
        if run is None:
            return None
        if not run:
            return [_packed(await self._entries.fetch(metadata, first))]
        self._stats.entries_read += len(run)
        return run

    async def _run(self, bookies: Sequence[str], first: int, last: int) -> list[bytes] | None:
        """The checked run from ``first`` of the first bookie to answer with one; ``[]``
        when none did, None when none of them speaks protocol 3."""
        spoken = False
        order = self._pool.read_order(list(bookies))
        failed = self._failed
        for bookie in [b for b in order if b not in failed] + [b for b in order if b in failed]:
            try:
                conn = await self._pool.get(bookie)
                if conn.protocol_version < RANGE_VERSION:
                    continue
                spoken = True
                request = ReadRangeRequest(
                    conn.next_txn_id(), self._ledger_id, first, last, RANGE_BYTES
                )
                response = await conn.send(request, self._timeout)
            except BKError:
                spoken = True  # unknown: the entry-by-entry read will find out
                failed.add(bookie)
                continue
            if isinstance(response, ReadRangeResponse) and response.status == StatusCode.EOK:
                run = self._verified(response.bodies, first, last)
                if run:
                    return run
            failed.add(bookie)
        return [] if spoken else None

    def _verified(self, packed: bytes, first: int, last: int) -> list[bytes]:
        """The bodies of an answer, each checked; those before the first that fails. An
        answer the compiled check takes whole (``client.run_check``) needs nothing more."""
        digest = self._digest
        whole = check_run(
            packed, self._ledger_id, first, last, int(digest.kind), digest.checks_digest()
        )
        if whole is not None:
            return whole
        try:
            bodies = unpack_range(packed, self._ledger_id, first, last)
        except BatchError:
            return []
        check = self._digest.check_body
        ledger_id = self._ledger_id
        for entry_id, body in enumerate(bodies, first):
            try:
                check(body, ledger_id, entry_id)
            except DigestMismatchError:
                return bodies[: entry_id - first]
        return bodies


def _packed(body: EntryBody) -> bytes:
    """An entry read by a plain READ, as its bookie served it."""
    return pack_entry(body.signed_part, body.digest, body.payload)


def _fragment_end(metadata: LedgerMetadata, entry_id: int) -> int:
    """The last entry id the fragment holding ``entry_id`` may hold (the next one's first
    entry less one; unbounded for the last fragment)."""
    for fragment in metadata.fragments:
        if fragment.first_entry_id > entry_id:
            return fragment.first_entry_id - 1
    return MAX_ENTRY_ID


__all__ = ["RANGE_BYTES", "RangeReader"]
