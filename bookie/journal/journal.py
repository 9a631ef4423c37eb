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

Files (``bookie.journal.files``) roll over at ``max_file_size``; a file is deleted once a
checkpoint covers all of it. Replay (``bookie.journal.replay``) reads every record after the
checkpoint's LSN and refuses (``JournalCorruptError``) if one is missing or damaged in a way that
is not a torn tail. The fdatasyncs run in their own stage (``bookie.journal.sync``); this module
keeps the queue, the writer stage and the failure state.

A write or fdatasync that fails (a full disk, an I/O error) fails every record not yet synced
and stops the journal: ``failed`` is set, ``on_failure`` tells the bookie (which turns
read-only), and appends are refused at once without taking an LSN. The bytes of the records it
failed are kept, in order; ``recover()`` writes them again where they began and syncs them,
and only then does the journal take records again -- so LSNs stay dense on disk, and a record
that was answered with an error may still be found by replay (as any add that reached a disk
and was never acknowledged may), never a gap.

Timed: see ``bookie.journal.batch.count_batch``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from aiobk.bookie import record_codecs
from aiobk.bookie.disk import AppendFile, Disk
from aiobk.bookie.journal.batch import Batch, Callback, JournalFailedError, count_batch, notify
from aiobk.bookie.journal.files import JournalFiles
from aiobk.bookie.journal.format import Record, RecordType, encode_record, padding
from aiobk.bookie.journal.policy import JOURNAL_ALIGNMENT, BatchPlan, GroupCommitPolicy, batch_plan
from aiobk.bookie.journal.queue import RecordQueue
from aiobk.bookie.journal.sync import SyncStage
from aiobk.bookie.stats import BookieStats
from aiobk.tasks import cancel_and_wait

__all__ = ["SLOW_WRITE", "SLOW_WRITE_BATCHES", "Callback", "Journal", "JournalFailedError"]

log = logging.getLogger(__name__)

# A write on the event loop that takes longer than this (the kernel throttling a writer while
# the disk drains dirty pages: a copy into the page cache takes well under a millisecond a
# batch) sends the next SLOW_WRITE_BATCHES batches to the journal's thread, where waiting for
# the disk holds up nobody but the journal.
SLOW_WRITE = 0.010
SLOW_WRITE_BATCHES = 256


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


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
        self._policy = policy
        self._sync_data = sync_data
        self._inline_records = inline_records
        self._alignment = alignment
        self.stats = stats = stats or BookieStats()
        self._files = JournalFiles(disk, directory, max_file_size)
        self._queue = RecordQueue()
        self._idle = False  # the writer task is parked waiting for work
        self.urgent = False  # replies being made now should be written at once
        self._next_lsn = 0
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._failed: BaseException | None = None
        self._stalled: list[Batch] = []  # failed, in LSN order: written again by recover()
        self._offload_writes = 0  # batches still to hand to the thread after a slow write here
        self.on_failure: Callable[[BaseException], None] | None = None
        self._stopping = False
        self._sync = SyncStage(
            stats,
            volatile_sync_delay,
            fail=self._fail,
            failed=lambda: self._failed,
            stall=self._stalled.extend,
        )

    @property
    def next_lsn(self) -> int:
        return self._next_lsn

    @property
    def last_lsn(self) -> int:
        """LSN of the last record appended (queued or written)."""
        return self._next_lsn - 1

    def position(self) -> tuple[int, int] | None:
        """Where a checkpoint taken now may let the next replay start (``JournalFiles``)."""
        return self._files.position()

    @property
    def files(self) -> list[str]:
        return self._files.files

    @property
    def queue_size(self) -> int:
        """Records appended and not written yet (a gauge: BookKeeper's JOURNAL_QUEUE_SIZE)."""
        return self._queue.records

    @property
    def sync_queue_size(self) -> int:
        """Batches and barriers waiting for an fdatasync (JOURNAL_FORCE_WRITE_QUEUE_SIZE)."""
        return self._sync.size

    @property
    def failed(self) -> BaseException | None:
        """Why the journal stopped taking records (None while it works)."""
        return self._failed

    async def replay(
        self,
        after_lsn: int,
        apply: Callable[[Record], None],
        start: tuple[int, int] | None = None,
    ) -> int:
        """Apply every record above ``after_lsn``, in order, from the checkpoint's ``position``
        (``start``); return how many. ``next_lsn`` is then one past the highest LSN known."""
        applied, self._next_lsn = await self._files.replay(after_lsn, apply, start)
        return applied

    async def start(self, next_lsn: int | None = None) -> None:
        """Open a fresh journal file and start the writer (after ``replay``)."""
        if next_lsn is not None:
            self._next_lsn = max(self._next_lsn, next_lsn)
        await self._files.make_dir()
        try:
            await self._files.open(self._next_lsn)
        except OSError as exc:
            # No room for a new file (a full disk at boot): start failed, as after a failed
            # write; recover() opens the file once there is room.
            self._files.handle = None
            self._fail(exc, [])
        self._task = asyncio.get_running_loop().create_task(self._run(), name="journal-writer")
        self._sync.start()

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
        records = record_codecs.encode_adds(lsn, ledger_id, entries)
        self._queue_records(records, count, lsn, callback, on_written)
        return lsn + count - 1

    def _queue_records(
        self,
        data: bytes,
        count: int,
        first_lsn: int,
        callback: Callback,
        on_written: Callback | None,
    ) -> None:
        self._queue.add(data, count, first_lsn, callback, on_written)
        self.stats.journal_records += count
        if self._wakeup is not None:
            _wake(self._wakeup)

    def barrier(self, callback: Callback) -> None:
        """Run ``callback`` once everything appended so far is synced."""
        if self._failed is not None:
            asyncio.get_running_loop().call_soon(callback, self._failed)
            return
        self._queue.add_barrier(callback)
        if self._wakeup is not None:
            _wake(self._wakeup)

    def flush_idle(self) -> bool:
        """Idle fast path, called when a connection has handed over everything it read: if the
        writer is idle and the queue is one small persistent record, write and sync it here and
        run its callbacks now -- the writer task would do exactly this one loop turn later.
        Replies made meanwhile go out at once (``urgent``). True if it did."""
        queue = self._queue
        handle = self._files.handle
        if (
            not self._idle
            or handle is None
            or self._failed is not None
            or not self._policy.flush_when_queue_empty
            or not queue.chunks
            or handle.size + queue.size > self._files.max_file_size
        ):
            return False
        offset = handle.size
        pad = padding(offset + queue.size, self._alignment)
        size = queue.size + len(pad)
        plan = batch_plan(
            len(queue.callbacks),
            len(queue.written),
            size,
            sync_data=self._sync_data,
            sync_busy=self._sync.busy(),
            inline_records=self._inline_records,
            write_here=not self._offload_writes and handle.room >= size,
        )
        if plan is not BatchPlan.SYNC_HERE:
            return False  # the writer task takes it, a loop turn later
        data, records, callbacks, _written, first_lsn = queue.take()  # SYNC_HERE: none written
        data += pad
        assert first_lsn is not None
        error: BaseException | None = None
        try:
            started = self.stats.clock()
            handle.write_and_sync_now(data)
            count_batch(self.stats, data, records, started, synced=True)
        except OSError as exc:
            error = self._fail(exc, [Batch(first_lsn, handle, offset, data)])
        self.urgent = True
        try:
            notify(callbacks, error)
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
        queue = self._queue
        while True:
            if not queue.callbacks:
                if self._stopping:
                    return
                await self._wait(None)
                continue
            if self._failed is not None:
                self._stall_queue()  # queued before the failure: not written until recover()
                continue
            delay = policy.flush_delay(max(queue.size, 1), queue.oldest, loop.time())
            if delay and not self._stopping:
                await self._wait(delay)
                continue
            data, records, callbacks, written, first_lsn = queue.take()
            # Someone waits for this batch's sync unless every record in it is volatile (each
            # volatile record has a callback in both lists; persistent ones and barriers in one).
            urgent = len(callbacks) > len(written)
            if not data:  # barriers only: done once everything written before is synced
                self._sync.after_sync(callbacks)
                continue
            assert first_lsn is not None
            batch = Batch(first_lsn, None, 0, data)
            try:
                handle = batch.handle = await self._files.file_for(
                    len(data), first_lsn, self._sync.drain_or_raise
                )
                batch.offset = handle.size
                data = batch.data = data + padding(handle.size + len(data), self._alignment)
                plan = batch_plan(
                    len(callbacks),
                    len(written),
                    len(data),
                    sync_data=self._sync_data,
                    sync_busy=self._sync.busy(),
                    inline_records=self._inline_records,
                    write_here=self._may_write_here(handle, len(data)),
                )
                started = self.stats.clock()
                if plan is BatchPlan.SYNC_HERE:
                    handle.write_and_sync_now(data)
                    count_batch(self.stats, data, records, started, synced=True)
                    notify(callbacks, None)
                    continue
                if plan is BatchPlan.WRITE_HERE:
                    handle.write_now(data)  # volatile: into the page cache, answer at once
                    if count_batch(self.stats, data, records, started, synced=False) > SLOW_WRITE:
                        self._offload_writes = SLOW_WRITE_BATCHES
                else:
                    await handle.write(data)
                    count_batch(self.stats, data, records, started, synced=False)
            except OSError as exc:
                if self._sync.busy():
                    # Batches before this one wait for a sync: the sync stage fails them and
                    # this one after them, so that they are stalled in LSN order.
                    self._fail(exc, [])
                    self._sync.submit((None, [*written, *callbacks], batch))
                else:
                    notify((*written, *callbacks), self._fail(exc, [batch]))
                continue
            if self.failed is not None:  # a sync failed while this batch was being written
                self._sync.submit((handle, [*written, *callbacks], batch))
                continue
            notify(written, None)
            if not self._sync_data:
                notify(callbacks, None)
            else:
                self._sync.submit((handle, callbacks, batch), lazy=not urgent)

    def _fail(self, exc: OSError, batches: list[Batch]) -> BaseException:
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
        data, _records, callbacks, written, first_lsn = self._queue.take()
        callbacks = [*written, *callbacks]
        batch = Batch(first_lsn, None, 0, data) if data and first_lsn is not None else None
        self._sync.submit((None, callbacks, batch))

    async def recover(self) -> bool:
        """After a failure, write the stalled records again where they began and sync them;
        True once the journal takes records again (at once if it never failed)."""
        if self._failed is None:
            return True
        await self._sync.drain()  # every failed group is stalled, in order
        stalled = self._stalled
        files = self._files
        try:
            if files.handle is None:  # a rollover, or the start, could not open its file
                await files.open(stalled[0].first_lsn if stalled else self._next_lsn)
            if stalled:
                first = stalled[0]
                handle = files.handle
                assert handle is not None
                if first.handle is handle:
                    await handle.rewind(first.offset)
                data = b"".join(batch.data for batch in stalled)
                data += padding(handle.size + len(data), self._alignment)
                started = self.stats.clock()
                await handle.write_and_sync(data)
                count_batch(self.stats, data, 0, started, synced=True)
        except OSError as exc:
            log.warning("journal cannot write its stalled records yet: %s", exc)
            return False
        self._stalled.clear()  # the sync stage's stall extends this very list
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

    async def release(self, upto_lsn: int) -> int:
        """Delete journal files whose every record is at or below ``upto_lsn``; return count."""
        return await self._files.release(upto_lsn)

    async def stop(self) -> None:
        """Write and sync everything queued, then stop the writer and close the file."""
        self._stopping = True
        if self._wakeup is not None:
            _wake(self._wakeup)
        if self._task is not None:
            await self._task
            self._task = None
        await self._sync.stop()
        await self._files.close()

    async def crash(self) -> None:
        """Stop at once: queued records are neither written nor acknowledged."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        await self._sync.crash()
        self._queue.clear()
        await self._files.close()
