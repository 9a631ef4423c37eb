"""What the journal's stages hand each other: a written ``Batch`` (kept so that a failed one can
be written again where it began), a ``Group`` waiting for an fdatasync, the ``Callback`` each
record is answered with, ``notify``, which answers them, and ``count_batch``, which counts a
written batch. The writer stage and the sync stage both speak these terms, so they live apart
from either.

Timed (``BookieStats.histograms``, by ``BookieStats.clock``): ``journal_flush``, each write of a
batch apart from its fdatasync (BookKeeper's JOURNAL_FLUSH_LATENCY); ``journal_sync``, each
fdatasync (JOURNAL_SYNC) -- for a batch written and synced in one call on the loop, that call;
``journal_batch_entries`` and ``journal_batch_bytes``, the records and bytes of each batch.
(``journal_sync`` of the sync stage's own fdatasyncs is recorded there.)"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiobk.bookie.disk import AppendFile
from aiobk.bookie.stats import BookieStats

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]


class JournalFailedError(OSError):
    """The journal could not write or sync; nothing more is acknowledged until it recovers."""


@dataclass(slots=True)
class Batch:
    """Records written together: where, so that they can be written there again."""

    first_lsn: int
    handle: AppendFile | None  # None: the file meant to take them could not be opened
    offset: int
    data: bytes


# A group waiting for a sync: the file, the callbacks it answers, the batch it covers (none
# for barriers).
Group = tuple[AppendFile | None, list[Callback], Batch | None]


def notify(callbacks: Iterable[Callback], error: BaseException | None) -> None:
    """Run each callback; one that raises (say, setting a future its waiter cancelled) is
    logged and must not stop the journal or the callbacks after it."""
    for callback in callbacks:
        try:
            callback(error)
        except Exception:
            log.exception("journal callback failed")


def count_batch(
    stats: BookieStats, data: bytes, records: int, started: float, synced: bool
) -> float:
    """Count a batch of ``records`` (0: not known) just written -- and synced, by the same
    call, if ``synced`` -- by a call made at ``started``; return how long it took."""
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
