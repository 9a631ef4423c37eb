"""The journal: a group-committed write-ahead log of adds and ledger state changes.

Every record gets the next LSN when it is appended. Appending only queues the encoded record;
one writer task takes the whole queue, writes it with one write and one fdatasync on the
journal's own I/O lane, then runs every record's callback. Nothing is acknowledged before the
fdatasync that covers it (BookKeeper "Writing to ledgers": a bookie acknowledges a write once it
has been durably persisted). ``policy`` decides when a batch starts.

BP-14 volatile adds are answered once written. Their fdatasync only moves the ledger's sync
cursor (LastAddSynced), so a batch of nothing but volatile records does not start one at once:
it waits up to ``volatile_sync_delay`` for one that persistent work, a ``force()`` or the next
batch brings anyway. An idle volatile writer then costs a sync per delay, not one per add --
the fewer fdatasyncs BP-14 is for ("Performance degradation happens when using single-disk
layout").

Where a batch is written (``policy.batch_plan``): a lone small persistent record of an
idle journal is written and synced on the event loop; a batch of volatile records up to
``INLINE_WRITE_BYTES`` is written on the loop (a copy into the page cache) and answered; the
rest, and any batch whose write would first have to allocate more of the file, on the journal's
thread. A write on the loop slower than ``SLOW_WRITE`` (the kernel throttling a writer that
dirties pages faster than the disk takes them) sends the next batches to the thread.

Files roll over at ``max_file_size``; a file is deleted once a checkpoint covers all of it.
Replay (``bookie.journal.replay``) reads every record after the checkpoint's LSN and refuses
(``JournalCorruptError``) if one is missing or damaged in a way that is not a torn tail.

A write or fdatasync that fails (a full disk, an I/O error) fails every record not yet synced
and stops the journal: ``failed`` is set, ``on_failure`` tells the bookie (which turns
read-only), and appends are refused at once without taking an LSN. The bytes of the records it
failed are kept, in order; ``recover()`` writes them again where they began and syncs them,
and only then does the journal take records again -- so LSNs stay dense on disk, and a record
that was answered with an error may still be found by replay (as any add that reached a disk
and was never acknowledged may), never a gap.

Timed (``BookieStats.histograms``, by ``BookieStats.clock``): ``journal_flush``, each write of a
batch apart from its fdatasync (BookKeeper's JOURNAL_FLUSH_LATENCY); ``journal_sync``, each
fdatasync (JOURNAL_SYNC) -- for a batch written and synced in one call on the loop, that call;
``journal_batch_entries`` and ``journal_batch_bytes``, the records and bytes of each batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from aiobk.bookie.disk import AppendFile, Disk
from aiobk.bookie.journal.format import (
    FILE_HEADER,
    Record,
    RecordType,
    encode_adds,
    encode_file_header,
    encode_record,
    padding,
)
from aiobk.bookie.journal.policy import JOURNAL_ALIGNMENT, BatchPlan, GroupCommitPolicy, batch_plan
from aiobk.bookie.journal.replay import file_name, replay
from aiobk.bookie.stats import BookieStats

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]
PREALLOCATE = 4 * 1024 * 1024  # zero-filled ahead: fdatasyncs of overwrites commit no metadata
# A write on the event loop that takes longer than this (the kernel throttling a writer while
# the disk drains dirty pages: a copy into the page cache takes well under a millisecond a
# batch) sends the next SLOW_WRITE_BATCHES batches to the journal's thread, where waiting for
# the disk holds up nobody but the journal.
SLOW_WRITE = 0.010
SLOW_WRITE_BATCHES = 256


def _notify(callbacks: Iterable[Callback], error: BaseException | None) -> None:
    """Run each callback; one that raises (say, setting a future its waiter cancelled) is
    logged and must not stop the journal or the callbacks after it."""
    for callback in callbacks:
        try:
            callback(error)
        except Exception:
            log.exception("journal callback failed")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class JournalFailedError(OSError):
    """The journal could not write or sync; nothing more is acknowledged until it recovers."""


@dataclass(slots=True)
class _Batch:
    """Records written together: where, so that they can be written there again."""

    first_lsn: int
    handle: AppendFile | None  # None: the file meant to take them could not be opened
    offset: int
    data: bytes


# A group waiting for a sync: the file, the callbacks it answers, the batch it covers (none
# for barriers).
_Group = tuple[AppendFile | None, list[Callback], _Batch | None]


class Journal:
    def __init__(
        self,
        disk: Disk,
        directory: str,
        policy: GroupCommitPolicy,
        *,
        max_file_size: int,
        sync_data: bool = True,
        stats: BookieStats | None = None,
        inline_records: int = 1,
        alignment: int = JOURNAL_ALIGNMENT,
        volatile_sync_delay: float = 0.0,
    ) -> None:
        self._disk = disk
        self._dir = directory
        self._policy = policy
        self._max_file_size = max_file_size
        self._sync_data = sync_data
        self._inline_records = inline_records
        self._alignment = alignment
        self.stats = stats or BookieStats()
        self._queue: list[bytes] = []  # encoded records; an item may hold several
        self._queued_records = 0
        self._callbacks: list[Callback] = []
        self._written: list[Callback] = []  # BP-14: run after the write, before the sync
        self._sync_groups: list[_Group] = []
        # Written batches of volatile records only, waiting for a sync (see the module doc).
        self._lazy_groups: list[_Group] = []
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._volatile_sync_delay = volatile_sync_delay
        self._syncing = False
        self._sync_wakeup: asyncio.Future[None] | None = None
        self._sync_idle: list[asyncio.Future[None]] = []
        self._sync_task: asyncio.Task[None] | None = None
        self._sync_stopping = False
        self._idle = False  # the writer task is parked waiting for work
        self.urgent = False  # replies being made now should be written at once
        self._queued_bytes = 0
        self._oldest = 0.0
        self._first_queued_lsn: int | None = None
        self._next_lsn = 0
        self._files: list[tuple[int, str]] = []  # (first LSN, path), oldest first
        self._closed_at: tuple[int, int] | None = None  # the last closed file's position
        self._file: AppendFile | None = None
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._failed: BaseException | None = None
        self._stalled: list[_Batch] = []  # failed, in LSN order: written again by recover()
        self._offload_writes = 0  # batches still to hand to the thread after a slow write here
        self.on_failure: Callable[[BaseException], None] | None = None
        self._stopping = False

    @property
    def next_lsn(self) -> int:
        return self._next_lsn

    @property
    def last_lsn(self) -> int:
        """LSN of the last record appended (queued or written)."""
        return self._next_lsn - 1

    def position(self) -> tuple[int, int] | None:
        """(the current file's first LSN, the end of what was handed to it): every record
        before that offset was appended before this call, so a checkpoint that takes
        ``last_lsn`` right after covers them, and the next replay may start reading the file
        there instead of at its beginning (BookKeeper's LogMark). After a stop (whose final
        checkpoint takes it), the end of the last file; None before any file was open."""
        handle = self._file
        if handle is None:
            return self._closed_at  # stopped, or between files: the last one's end
        return self._files[-1][0], handle.size

    async def _close_file(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            self._closed_at = (self._files[-1][0], handle.size)
            await handle.close()

    @property
    def files(self) -> list[str]:
        return [path for _first, path in self._files]

    @property
    def queue_size(self) -> int:
        """Records appended and not written yet (a gauge: BookKeeper's JOURNAL_QUEUE_SIZE)."""
        return self._queued_records

    @property
    def sync_queue_size(self) -> int:
        """Written batches (and barriers) waiting for an fdatasync (a gauge: BookKeeper's
        JOURNAL_FORCE_WRITE_QUEUE_SIZE)."""
        return len(self._sync_groups) + len(self._lazy_groups)

    @property
    def failed(self) -> BaseException | None:
        """Why the journal stopped taking records (None while it works)."""
        return self._failed

    # ------------------------------------------------------------------ replay

    async def replay(
        self,
        after_lsn: int,
        apply: Callable[[Record], None],
        start: tuple[int, int] | None = None,
    ) -> int:
        """Apply every record with an LSN above ``after_lsn``, in order; return how many
        (``bookie.journal.replay``). ``start``: the ``position`` the checkpoint recorded, where
        reading its file may begin. Afterwards ``next_lsn`` is one past the highest LSN known
        (replayed or checkpointed)."""
        replayed = await replay(self._disk, self._dir, after_lsn, apply, start)
        self._files, self._next_lsn = replayed.files, replayed.next_lsn
        return replayed.applied

    # ------------------------------------------------------------------ writing

    async def start(self, next_lsn: int | None = None) -> None:
        """Open a fresh journal file and start the writer (after ``replay``)."""
        if next_lsn is not None:
            self._next_lsn = max(self._next_lsn, next_lsn)
        await self._disk.makedirs(self._dir)
        try:
            await self._open_file(self._next_lsn)
        except OSError as exc:
            # No room for a new file (a full disk at boot): start failed, as after a failed
            # write; recover() opens the file once there is room.
            self._file = None
            self._fail(exc, [])
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="journal-writer")
        self._sync_task = loop.create_task(self._sync_loop(), name="journal-sync")

    async def _open_file(self, first_lsn: int) -> None:
        path = os.path.join(self._dir, file_name(first_lsn))
        if self._files and self._files[-1][0] == first_lsn:
            # A previous boot created this file and crashed before any record reached it.
            self._files.pop()
            await self._disk.remove(path)
        elif await self._disk.exists(path):
            await self._disk.remove(path)
        handle = await self._disk.open_append(
            path, "journal", sync_lane="journal-sync", preallocate=PREALLOCATE
        )
        await handle.write_and_sync(encode_file_header(first_lsn))
        self._file = handle
        self._files.append((first_lsn, path))

    def append(
        self,
        kind: RecordType,
        payload: bytes,
        callback: Callback,
        on_written: Callback | None = None,
    ) -> int:
        """Queue a record; ``callback(None)`` runs after the fdatasync that covers it, and
        ``on_written(None)`` (BP-14 volatile adds) as soon as it is written, before that."""
        if self._failed is not None:
            asyncio.get_running_loop().call_soon(callback, self._failed)
            return -1  # no LSN: nothing is written until recover(), and LSNs must stay dense
        lsn = self._next_lsn
        self._next_lsn = lsn + 1
        record = encode_record(kind, lsn, payload)
        self._queue_records(record, 1, lsn, callback, on_written)
        return lsn

    def append_adds(
        self,
        ledger_id: int,
        entries: Sequence[tuple[int, bytes]],
        callback: Callback,
        on_written: Callback | None = None,
    ) -> int:
        """``append`` of an ADD record for each (entry id, body) of one ledger -- an ADD_BATCH's
        entries, in order -- with one callback for them all. They are queued as one piece, so
        they are written, synced or failed together, and the callbacks run as for one record.
        Returns the last record's LSN."""
        if self._failed is not None:
            asyncio.get_running_loop().call_soon(callback, self._failed)
            return -1
        lsn = self._next_lsn
        count = len(entries)
        self._next_lsn = lsn + count
        self._queue_records(encode_adds(lsn, ledger_id, entries), count, lsn, callback, on_written)
        return lsn + count - 1

    def _queue_records(
        self,
        data: bytes,
        count: int,
        first_lsn: int,
        callback: Callback,
        on_written: Callback | None,
    ) -> None:
        if not self._callbacks:
            self._oldest = asyncio.get_running_loop().time()
        if self._first_queued_lsn is None:
            self._first_queued_lsn = first_lsn
        self._queue.append(data)
        self._queued_records += count
        self._callbacks.append(callback)
        if on_written is not None:
            self._written.append(on_written)
        self._queued_bytes += len(data)
        self.stats.journal_records += count
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def barrier(self, callback: Callback) -> None:
        """Run ``callback`` once everything appended so far is synced."""
        if self._failed is not None:
            asyncio.get_running_loop().call_soon(callback, self._failed)
            return
        if not self._callbacks:
            self._oldest = asyncio.get_running_loop().time()
        self._callbacks.append(callback)
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def flush_idle(self) -> bool:
        """Idle fast path, called when a connection has handed over everything it read: if the
        writer is idle and the queue is one small persistent record, write and sync it here and
        run its callbacks now -- the writer task would do exactly this one loop turn later.
        Replies made meanwhile go out at once (``urgent``). True if it did."""
        handle = self._file
        if (
            not self._idle
            or handle is None
            or self._failed is not None
            or not self._policy.flush_when_queue_empty
            or not self._queue
            or handle.size + self._queued_bytes > self._max_file_size
        ):
            return False
        offset = handle.size
        pad = padding(offset + self._queued_bytes, self._alignment)
        size = self._queued_bytes + len(pad)
        plan = batch_plan(
            len(self._callbacks),
            len(self._written),
            size,
            sync_data=self._sync_data,
            sync_busy=self._sync_busy(),
            inline_records=self._inline_records,
            write_here=not self._offload_writes and handle.room >= size,
        )
        if plan is not BatchPlan.SYNC_HERE:
            return False  # the writer task takes it, a loop turn later
        data = b"".join(self._queue) + pad
        records = self._queued_records
        callbacks = self._callbacks
        first_lsn = self._first_queued_lsn
        assert first_lsn is not None
        self._queue, self._callbacks = [], []
        self._queued_records = 0
        self._queued_bytes = 0
        self._first_queued_lsn = None
        error: BaseException | None = None
        try:
            started = self.stats.clock()
            handle.write_and_sync_now(data)
            self._count(data, records, started, synced=True)
        except OSError as exc:
            error = self._fail(exc, [_Batch(first_lsn, handle, offset, data)])
        self.urgent = True
        try:
            _notify(callbacks, error)
        finally:
            self.urgent = False
        return True

    async def _wait(self, delay: float | None) -> None:
        loop = asyncio.get_running_loop()
        self._idle = delay is None
        self._wakeup = waiter = loop.create_future()
        handle = None
        if delay is not None:
            handle = loop.call_later(delay, _wake, waiter)
        try:
            await waiter
        finally:
            self._idle = False
            self._wakeup = None
            if handle is not None:
                handle.cancel()

    async def _run(self) -> None:
        """The writer stage: take the queue, write it, answer volatile adds, hand the rest to
        the sync stage -- and go on writing while that fdatasync runs."""
        loop = asyncio.get_running_loop()
        policy = self._policy
        while True:
            if not self._callbacks:
                if self._stopping:
                    return
                await self._wait(None)
                continue
            if self._failed is not None:
                self._stall_queue()  # queued before the failure: not written until recover()
                continue
            delay = policy.flush_delay(max(self._queued_bytes, 1), self._oldest, loop.time())
            if delay and not self._stopping:
                await self._wait(delay)
                continue
            data = b"".join(self._queue)
            records = self._queued_records
            callbacks = self._callbacks
            written = self._written
            first_lsn = self._first_queued_lsn
            # Someone waits for this batch's sync unless every record in it is volatile (each
            # volatile record has a callback in both lists; persistent ones and barriers in one).
            urgent = len(callbacks) > len(written)
            self._queue, self._callbacks, self._written = [], [], []
            self._queued_records = 0
            self._queued_bytes = 0
            self._first_queued_lsn = None
            if not data:  # barriers only: done once everything written before is synced
                self._after_sync(callbacks)
                continue
            assert first_lsn is not None
            batch = _Batch(first_lsn, None, 0, data)
            try:
                handle = batch.handle = await self._file_for(len(data), first_lsn)
                batch.offset = handle.size
                data = batch.data = data + padding(handle.size + len(data), self._alignment)
                plan = batch_plan(
                    len(callbacks),
                    len(written),
                    len(data),
                    sync_data=self._sync_data,
                    sync_busy=self._sync_busy(),
                    inline_records=self._inline_records,
                    write_here=self._may_write_here(handle, len(data)),
                )
                started = self.stats.clock()
                if plan is BatchPlan.SYNC_HERE:
                    handle.write_and_sync_now(data)
                    self._count(data, records, started, synced=True)
                    _notify(callbacks, None)
                    continue
                if plan is BatchPlan.WRITE_HERE:
                    handle.write_now(data)  # volatile: into the page cache, answer at once
                    if self._count(data, records, started, synced=False) > SLOW_WRITE:
                        self._offload_writes = SLOW_WRITE_BATCHES
                else:
                    await handle.write(data)
                    self._count(data, records, started, synced=False)
            except OSError as exc:
                if self._sync_busy():
                    # Batches before this one wait for a sync: the sync stage fails them and
                    # this one after them, so that they are stalled in LSN order.
                    self._fail(exc, [])
                    self._promote_lazy()
                    self._sync_groups.append((None, [*written, *callbacks], batch))
                    self._wake_syncer()
                else:
                    _notify((*written, *callbacks), self._fail(exc, [batch]))
                continue
            if self.failed is not None:  # a sync failed while this batch was being written
                self._promote_lazy()
                self._sync_groups.append((handle, [*written, *callbacks], batch))
                self._wake_syncer()
                continue
            _notify(written, None)
            if not self._sync_data:
                _notify(callbacks, None)
            elif urgent or self._volatile_sync_delay <= 0:
                self._promote_lazy()
                self._sync_groups.append((handle, callbacks, batch))
                self._wake_syncer()
            else:
                self._lazy_groups.append((handle, callbacks, batch))
                if self._lazy_timer is None:
                    self._lazy_timer = loop.call_later(self._volatile_sync_delay, self._lazy_due)

    def _fail(self, exc: OSError, batches: list[_Batch]) -> BaseException:
        """Stop taking records (see the module doc); return the error their callbacks get."""
        self._stalled.extend(batches)
        if self._failed is None:
            log.error("journal write or sync failed; nothing is acknowledged until it recovers")
            log.debug("journal failure", exc_info=exc)
            self.stats.journal_failures += 1
            self._failed = JournalFailedError(exc.errno, f"journal failed: {exc.strerror or exc}")
            if self.on_failure is not None:
                self.on_failure(self._failed)
        return self._failed

    def _stall_queue(self) -> None:
        """Hand what is queued to the sync stage, which fails it and stalls it after the
        batches written before it."""
        data = b"".join(self._queue)
        first_lsn = self._first_queued_lsn
        callbacks = [*self._written, *self._callbacks]
        self._queue, self._callbacks, self._written = [], [], []
        self._queued_records = 0
        self._queued_bytes = 0
        self._first_queued_lsn = None
        batch = _Batch(first_lsn, None, 0, data) if data and first_lsn is not None else None
        self._promote_lazy()
        self._sync_groups.append((None, callbacks, batch))
        self._wake_syncer()

    async def recover(self) -> bool:
        """After a failure, write the stalled records again where they began and sync them;
        True once the journal takes records again (at once if it never failed)."""
        if self._failed is None:
            return True
        await self._drain_syncs()  # every failed group is stalled, in order
        stalled = self._stalled
        try:
            if self._file is None:  # a rollover, or the start, could not open its file
                await self._open_file(stalled[0].first_lsn if stalled else self._next_lsn)
            if stalled:
                first = stalled[0]
                handle = self._file
                assert handle is not None
                if first.handle is handle:
                    await handle.rewind(first.offset)
                data = b"".join(batch.data for batch in stalled)
                data += padding(handle.size + len(data), self._alignment)
                started = self.stats.clock()
                await handle.write_and_sync(data)
                self._count(data, 0, started, synced=True)
        except OSError as exc:
            log.warning("journal cannot write its stalled records yet: %s", exc)
            return False
        self._stalled = []
        self._failed = None
        log.warning("journal recovered: it takes records again")
        return True

    def _may_write_here(self, handle: AppendFile, size: int) -> bool:
        """Whether a batch of ``size`` bytes may be written on the event loop now: the file
        has the room allocated (making more is a zero-fill and an fsync, the thread's work),
        and no write here was slow lately (``SLOW_WRITE``)."""
        if self._offload_writes:
            self._offload_writes -= 1
            return False
        return handle.room >= size

    def _count(self, data: bytes, records: int, started: float, synced: bool) -> float:
        """Count a batch of ``records`` (0: not known) just written -- and synced, by the same
        call, if ``synced`` -- by a call made at ``started``; return how long it took."""
        stats = self.stats
        elapsed = stats.clock() - started
        stats.journal_batches += 1
        stats.journal_bytes += len(data)
        histograms = stats.histograms
        if records:
            histograms.journal_batch_entries.record(records)
            histograms.journal_batch_bytes.record(len(data))
        if synced:
            stats.journal_syncs += 1
            histograms.journal_sync.record(elapsed)
        else:
            histograms.journal_flush.record(elapsed)
        return elapsed

    def _sync_busy(self) -> bool:
        return self._syncing or bool(self._sync_groups) or bool(self._lazy_groups)

    def _promote_lazy(self) -> None:
        """Hand waiting volatile batches to the sync stage. They were written after every group
        already there, so appending keeps the groups in write order."""
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        if self._lazy_groups:
            self._sync_groups.extend(self._lazy_groups)
            self._lazy_groups = []

    def _lazy_due(self) -> None:
        self._lazy_timer = None
        self._promote_lazy()
        self._wake_syncer()

    def _after_sync(self, callbacks: list[Callback]) -> None:
        """Run ``callbacks`` once every write so far is synced (now, if nothing is pending)."""
        if self._sync_busy():
            self._promote_lazy()
            self._sync_groups.append((None, callbacks, None))
            self._wake_syncer()
        else:
            _notify(callbacks, self._failed)

    def _wake_syncer(self) -> None:
        wakeup = self._sync_wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _sync_loop(self) -> None:
        """The sync stage: one fdatasync covers every batch written before it started."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._sync_groups:
                for waiter in self._sync_idle:
                    if not waiter.done():
                        waiter.set_result(None)
                self._sync_idle.clear()
                if self._sync_stopping:
                    return
                self._sync_wakeup = loop.create_future()
                try:
                    await self._sync_wakeup
                finally:
                    self._sync_wakeup = None
                continue
            self._promote_lazy()  # written before this fdatasync: it covers them for free
            groups, self._sync_groups = self._sync_groups, []
            self._syncing = True
            error: BaseException | None = self._failed
            try:
                if error is None:
                    stats = self.stats
                    for handle in dict.fromkeys(h for h, _cbs, _b in groups if h is not None):
                        started = stats.clock()
                        await handle.sync()
                        stats.histograms.journal_sync.record(stats.clock() - started)
                        stats.journal_syncs += 1
            except OSError as exc:
                error = self._fail(exc, [])
            finally:
                self._syncing = False
            if error is not None:
                # Not durable (a failed fdatasync may even have dropped the pages): written
                # again by recover(), in the order they were written.
                self._stalled.extend(b for _h, _cbs, b in groups if b is not None)
            for _handle, callbacks, _batch in groups:
                _notify(callbacks, error)

    async def _drain_syncs(self) -> None:
        if self._sync_busy():
            self._promote_lazy()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._sync_idle.append(waiter)
            self._wake_syncer()
            await waiter

    async def _file_for(self, size: int, first_lsn: int | None) -> AppendFile:
        """The journal file for the next write, rolled over when it would grow too big."""
        handle = self._file
        assert handle is not None
        if (
            first_lsn is not None
            and handle.size > FILE_HEADER.size
            and handle.size + size > self._max_file_size
        ):
            await self._drain_syncs()  # the old file's pending fdatasync must finish first
            if self._failed is not None:  # that fdatasync failed: stay on this file
                raise self._failed
            await self._close_file()
            await self._open_file(first_lsn)
            handle = self._file
            assert handle is not None
        return handle

    async def release(self, upto_lsn: int) -> int:
        """Delete journal files whose every record is at or below ``upto_lsn``; return count."""
        removed = 0
        while len(self._files) > 1 and self._files[1][0] <= upto_lsn + 1:
            _first, path = self._files.pop(0)
            await self._disk.remove(path)
            removed += 1
        return removed

    async def stop(self) -> None:
        """Write and sync everything queued, then stop the writer and close the file."""
        self._stopping = True
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)
        if self._task is not None:
            await self._task
            self._task = None
        self._promote_lazy()
        self._sync_stopping = True
        self._wake_syncer()
        if self._sync_task is not None:
            await self._sync_task
            self._sync_task = None
        await self._close_file()

    async def crash(self) -> None:
        """Stop at once: queued records are neither written nor acknowledged."""
        for task in (self._task, self._sync_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._sync_task = None
        self._queue, self._callbacks, self._written = [], [], []
        self._queued_records = 0
        self._sync_groups = []
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._lazy_groups = []
        await self._close_file()
