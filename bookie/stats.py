"""Figures a bookie keeps for operators and benchmarks: counters (plain ints) and latency and
size histograms (``aiobk.figures``), all cheap enough for the hot path. The exporter
(``aiobk.metrics``) reads them at scrape time.

Durations come from ``BookieStats.clock``: by default the running event loop's clock, which in
the simulator is its virtual clock, so figures are the same on every replay and nothing in the
bookie reads a clock of its own. uvloop's loop clock counts whole milliseconds, too coarse for
an fdatasync, so a process that exports its figures hands in a monotonic clock of full
resolution (``aiobk.metrics.bookie_collectors``, which ``serve_metrics`` uses). Both count
from the same origin (CLOCK_MONOTONIC), so an add timed across the switch is off by at most the
loop clock's millisecond. A started bookie reads its loop's clock through the loop's own
``time`` (``bound_to_loop``): a third of ``loop_clock``'s cost per reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from aiobk.figures import (
    BATCH_BYTES_BOUNDS,
    BATCH_ENTRIES_BOUNDS,
    Clock,
    Histogram,
    bound_to_loop,
    latency_histogram,
    loop_clock,
)


def _batch_entries() -> Histogram:
    return Histogram(BATCH_ENTRIES_BOUNDS)


def _batch_bytes() -> Histogram:
    return Histogram(BATCH_BYTES_BOUNDS)


@dataclass(slots=True)
class BookieHistograms:
    """Seconds, except the journal batch sizes (records, bytes)."""

    add_entry_request: Histogram = field(default_factory=latency_histogram)  # read -> answered
    read_entry: Histogram = field(default_factory=latency_histogram)  # long polls aside
    read_entry_long_poll_wait: Histogram = field(default_factory=latency_histogram)
    journal_flush: Histogram = field(default_factory=latency_histogram)  # a write, no sync
    journal_sync: Histogram = field(default_factory=latency_histogram)  # an fdatasync
    journal_batch_entries: Histogram = field(default_factory=_batch_entries)
    journal_batch_bytes: Histogram = field(default_factory=_batch_bytes)

    def as_dict(self) -> dict[str, Histogram]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class BookieStats:
    """A bookie's counters and latency histograms, kept as plain numbers on the hot path
    and read by the exporters at scrape time (the metrics reference explains each)."""

    adds: int = 0
    add_bytes: int = 0
    add_batches: int = 0  # ADD_BATCH requests (protocol 2); their entries count in ``adds``
    reads: int = 0
    range_reads: int = 0  # READ_RANGE requests (protocol 3); their entries count in ``reads``
    read_misses: int = 0
    long_polls: int = 0
    fences: int = 0
    bad_requests: int = 0
    auth_failures: int = 0
    permission_denials: int = 0  # EPERM: no TLS or handshake first, or a role missing
    tls_handshakes: int = 0  # connections upgraded to TLS
    tls_handshake_failures: int = 0
    connections: int = 0
    connections_refused: int = 0  # at max_connections with nothing idle to make room
    connections_evicted: int = 0  # idle ones closed to make room for a new one
    connections_timed_out: int = 0  # frame, write or idle timeout
    connections_shed: int = 0  # closed for holding the most when over max_connection_memory
    add_pauses: int = 0  # times every connection paused for max_add_bytes_in_progress
    long_polls_refused: int = 0  # ETOOMANYREQUESTS: over a long-poll cap
    journal_records: int = 0
    journal_batches: int = 0
    journal_syncs: int = 0
    journal_bytes: int = 0
    journal_failures: int = 0  # the journal stopped (write or sync failed) and had to recover
    checkpoints: int = 0
    checkpoint_failures: int = 0  # every failed attempt (each is logged, then retried)
    journal_records_skipped: int = 0  # replayed records storage could not keep (logged)
    entry_log_flushes: int = 0
    storage_syncs: int = 0  # entry log fsyncs (checkpoints, FORCE on journal-less bookies)
    corrupt_reads: int = 0
    disk_full_errors: int = 0  # writes that met ENOSPC (each turns the bookie read-only)
    gc_forced: int = 0  # garbage collection passes forced by the disk warning threshold
    adds_refused_read_only: int = 0  # EREADONLY answers
    gc_ledgers_deleted: int = 0
    gc_logs_removed: int = 0
    gc_bytes_freed: int = 0
    gc_entries_moved: int = 0  # live entries compaction copied out of mostly-dead logs
    gc_logs_compacted: int = 0
    ledger_states_loaded: int = 0  # states read back from the index (not in use before)
    ledger_states_dropped: int = 0  # idle states dropped after a checkpoint
    read_cache_hits: int = 0
    # Not counters (``as_dict`` leaves them out):
    histograms: BookieHistograms = field(default_factory=BookieHistograms)
    clock: Clock = loop_clock  # times the histograms (see the module doc)
    directories: tuple[str, ...] = ()  # journal and ledger directories, for their disk usage

    def as_dict(self) -> dict[str, int]:
        """The counters, by name (what the exporter turns into `aiobk_bookie_*_total`)."""
        return {name: getattr(self, name) for name in COUNTERS}


COUNTERS = tuple(f.name for f in fields(BookieStats) if f.type == "int")

__all__ = ["COUNTERS", "BookieHistograms", "BookieStats", "Clock", "bound_to_loop", "loop_clock"]
