"""Counters a bookie keeps for operators and benchmarks (plain ints: no cost on the hot path)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class BookieStats:
    adds: int = 0
    add_bytes: int = 0
    reads: int = 0
    read_misses: int = 0
    long_polls: int = 0
    fences: int = 0
    bad_requests: int = 0
    auth_failures: int = 0
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

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
