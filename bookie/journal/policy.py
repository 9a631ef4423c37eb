"""When the journal flushes: the group-commit decision, pure.

Theory of operation. Adds are queued as encoded records. The writer task takes the whole queue,
writes it with one ``write`` and one ``fdatasync``, then acknowledges every add in it. While that
I/O runs, new adds pile up and become the next batch, so under load one fdatasync covers many
adds without any waiting on purpose. This policy only decides whether to start a batch now or
wait a little for more, with BookKeeper's three knobs:

- ``flush_when_queue_empty``: start as soon as the writer is free (the default here).
- ``buffered_bytes_threshold``: start once this many bytes are queued.
- ``max_group_wait``: otherwise start once the oldest queued record has waited this long.

Each batch then ends with a padding record up to the next ``journal_alignment`` boundary
(``JOURNAL_ALIGNMENT`` unless set), so that the next batch starts on a boundary of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True)
class GroupCommitPolicy:
    max_group_wait: float = 0.002
    buffered_bytes_threshold: int = 512 * 1024
    flush_when_queue_empty: bool = True

    def flush_delay(self, queued_bytes: int, oldest_enqueued_at: float, now: float) -> float | None:
        """Seconds to wait before flushing the queue; 0.0 means now, None means nothing queued."""
        if queued_bytes <= 0:
            return None
        if self.flush_when_queue_empty or queued_bytes >= self.buffered_bytes_threshold:
            return 0.0
        return max(0.0, oldest_enqueued_at + self.max_group_wait - now)


# Journal writes are padded to the 512-byte sector, BookKeeper's journalAlignmentSize default:
# a batch never changes a sector that holds records an earlier fdatasync made durable. Padding
# to the 4 KiB page instead also keeps a batch off the page the previous one ended in, which
# only pays on a disk that makes a write to a page under writeback wait for it (stable pages:
# /sys/block/DEV/queue/stable_writes = 1, and btrfs) -- set journal_alignment = 4096 there.
# Measured on ext4 over a virtio disk without stable pages, three alternated runs a side
# (docs/benchmarks/results/2026-11-28-journal-alignment.md): a lone 1 KiB add took 1.5
# journal bytes per payload byte at 512 against 4.0 at 4096 (1.5 against 3.9 at 400 adds/s);
# adds/s and p50 at 1, 16 and 256 in flight were within the runs' spread of each other.
JOURNAL_ALIGNMENT = 512

INLINE_BYTES = 16 * 1024  # a lone record up to this size may be written and synced on the loop
# A batch with BP-14 volatile records, up to this size, is written on the loop: a copy into the
# page cache, answered at once -- where a hop to the journal's thread and back stood between
# the write and the answers (measured: 512 volatile adds in flight, -9% to +21% appends/s in
# six alternating pairs of runs, median +9%). Persistent batches stay on the thread: their
# answers wait for the sync stage anyway, and the copy there overlaps the loop's next work
# (written here they measured -4% to +8%, no gain). The journal still hands a batch to its
# thread when the write would first allocate more of the file (a zero-fill and an fsync) or
# when writes here have turned slow.
INLINE_WRITE_BYTES = 1024 * 1024


class BatchPlan(Enum):
    """How the writer puts one batch on disk (``batch_plan``)."""

    SYNC_HERE = "sync-here"  # write and fdatasync on the event loop, answer now
    WRITE_HERE = "write-here"  # write into the page cache on the event loop (volatile only)
    OFFLOAD = "offload"  # write on the journal's I/O lane; the sync stage syncs it


def batch_plan(
    records: int,
    volatile: int,
    size: int,
    *,
    sync_data: bool,
    sync_busy: bool,
    inline_records: int,
    write_here: bool = True,
) -> BatchPlan:
    """The one decision both writer paths take -- the idle fast path (``Journal.flush_idle``,
    right after a connection handed its requests over) and the writer task.

    An idle bookie with one small persistent record and no sync under way syncs it at once:
    that saves two thread hops, most of an idle add's cost. A batch of BP-14 volatile records
    up to ``INLINE_WRITE_BYTES`` goes into the page cache at once and is answered. Everything
    else is written on the I/O lane, and the sync stage overlaps its fdatasync with the next
    write -- under load batches are larger and that overlap is what pays.

    ``records``: callbacks in the batch (records and barriers); ``volatile``: of those, the
    BP-14 ones answered when written; ``size``: bytes to write, padding included;
    ``write_here``: the journal may write on the loop now (the file has room allocated for
    the batch, and writes here have been quick)."""
    if not write_here:
        return BatchPlan.OFFLOAD
    if (
        sync_data
        and not volatile
        and not sync_busy
        and records <= inline_records
        and size <= INLINE_BYTES
    ):
        return BatchPlan.SYNC_HERE
    if volatile and size <= INLINE_WRITE_BYTES:
        return BatchPlan.WRITE_HERE
    return BatchPlan.OFFLOAD
