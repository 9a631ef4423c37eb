"""What each exported figure means: one line of help per figure of a bookie, an autorecovery
process and a client, and of the process-wide ones (build info, event-loop lag, metadata
connectivity); and which of the autorecovery's figures are gauges.

Kept apart from the collectors so the figures' meanings read as one catalogue: a test checks
that every figure the stats classes keep has its line here, and the documentation's metrics
reference is built from these texts (``docs/hooks/reference.py``).
"""

from __future__ import annotations

# AutoRecoveryStats' figures that go up and down (the rest only ever grow). Named here rather
# than in the stats class, which stays free of exporting concerns.
AUTORECOVERY_GAUGES = frozenset(
    {
        "under_replicated_ledgers",
        "lost_ledgers",
        "lost_bookies",
        "bookies_registered",
        "bookies_writable",
        "bookies_readonly",
        "misplaced_ledgers",
    }
)

# One line per figure, by its exported name without the prefix (and without a counter's
# _total); BookKeeper's name in brackets where one maps.
BOOKIE_HELP: dict[str, str] = {
    # counters
    "adds": "Add requests received, refused ones included [ADD_ENTRY].",
    "add_bytes": "Entry bytes of the add requests taken for the journal and ledger storage.",
    "add_batches": "ADD_BATCH requests received (protocol 2); each of their entries is an add.",
    "range_reads": "READ_RANGE requests received (protocol 3); each entry answered is a read.",
    "reads": "Read requests received, fencing reads and long polls included [READ_ENTRY].",
    "read_misses": "Reads of an entry this bookie does not have (ENOENTRY, or EUNKNOWN in limbo).",
    "long_polls": "Long-poll reads that waited for the ledger's LAC to move.",
    "fences": "Ledgers fenced on this bookie (a recovery's fencing read, or a boot's fence).",
    "bad_requests": "Requests that could not be decoded or were invalid (EBADREQ or a close).",
    "auth_failures": "Requests refused for a wrong master key (EUA).",
    "permission_denials": "Requests refused EPERM: TLS or a handshake first, or a missing role.",
    "tls_handshakes": "Connections upgraded to TLS (START_TLS).",
    "tls_handshake_failures": "TLS handshakes that failed (untrusted certificate, timeout).",
    "connections": "Client connections accepted.",
    "connections_refused": "Connections refused at max_connections with none idle to close.",
    "connections_evicted": "Idle connections closed to make room for a new one.",
    "connections_timed_out": "Connections closed for a frame, write or idle timeout.",
    "connections_shed": "Connections closed for holding the most when over max_connection_memory.",
    "add_pauses": "Times every connection stopped reading at max_add_bytes_in_progress.",
    "long_polls_refused": "Long polls answered ETOOMANYREQUESTS, over a long-poll cap.",
    "journal_records": "Records appended to the journal (adds, fences, keys, explicit LACs).",
    "journal_batches": "Journal writes, each one group commit of records.",
    "journal_syncs": "Journal fdatasyncs [JOURNAL_NUM_FORCE_WRITES].",
    "journal_bytes": "Bytes written to the journal, padding included [JOURNAL_WRITE_BYTES].",
    "journal_failures": "Times the journal stopped on a failed write or sync and had to recover.",
    "checkpoints": "Checkpoints completed (ledger storage durable, the journal trimmed).",
    "checkpoint_failures": "Checkpoint attempts that failed (each logged, then retried).",
    "journal_records_skipped": "Replayed journal records ledger storage could not keep (logged).",
    "entry_log_flushes": "Entry log buffers written to their files.",
    "storage_syncs": "Entry log fsyncs (checkpoints, FORCE on a journal-less bookie).",
    "corrupt_reads": "Stored entries or index blocks that failed their checksum (answered EIO).",
    "disk_full_errors": "Writes that met ENOSPC (each turns the bookie read-only).",
    "gc_forced": "Garbage collection passes forced by the disk usage warning threshold.",
    "adds_refused_read_only": "Adds answered EREADONLY while the bookie was read-only.",
    "gc_ledgers_deleted": "Deleted ledgers whose data garbage collection dropped.",
    "gc_logs_removed": "Entry log files garbage collection removed.",
    "gc_bytes_freed": "Disk bytes garbage collection freed.",
    "gc_entries_moved": "Live entries compaction copied out of mostly-dead entry logs.",
    "gc_logs_compacted": "Entry logs compaction emptied and removed.",
    "ledger_states_loaded": "Ledger states read back from the index (not in memory before).",
    "ledger_states_dropped": "Idle ledger states dropped from memory after a checkpoint.",
    "read_cache_hits": "Entry reads served from the read cache.",
    # gauges
    "writable": "1 while the bookie takes adds, 0 while read-only [SERVER_STATUS].",
    "high_priority_writes": "1 while recovery adds are still taken (room above the reserve).",
    "checkpoint_failing": "1 while the last checkpoint failed and none has worked since.",
    "journal_failed": "1 while the journal is stopped after a failed write or sync.",
    "connections_open": "Client connections open now.",
    "connection_bytes_held": "Bytes connections hold now (partial frames, unsent responses).",
    "add_bytes_in_progress": "Entry bytes of adds received and not answered yet.",
    "long_polls_waiting": "Long polls waiting now.",
    "journal_queue_size": "Journal records appended and not written yet [JOURNAL_QUEUE_SIZE].",
    "journal_force_write_queue_size": (
        "Journal batches written and waiting for an fdatasync [JOURNAL_FORCE_WRITE_QUEUE_SIZE]."
    ),
    "ledgers_held": "Ledgers this bookie holds data or state for [NUM_OPEN_LEDGERS].",
    "ledger_states_in_use": "Ledger states loaded in memory now.",
    "write_cache_bytes": "Bytes of entry locations held since the last checkpoint [write_cache].",
    "write_cache_max_bytes": "Write cache size that starts a checkpoint (write_cache_max_size).",
    "read_cache_bytes": "Bytes of recently read entries cached [read_cache_size].",
    "read_cache_max_bytes": "Read cache capacity in bytes (read_cache_max_size).",
    "disk_free_bytes": "Bytes free on the filesystem of a bookie directory (label dir).",
    "disk_total_bytes": "Size in bytes of the filesystem of a bookie directory (label dir).",
    # histograms
    "add_entry_request_seconds": (
        "Add latency, from handling the request to queuing its answer [ADD_ENTRY_REQUEST]."
    ),
    "read_entry_seconds": (
        "Read latency (long polls aside), from handling the request to its answer [READ_ENTRY]."
    ),
    "read_entry_long_poll_wait_seconds": (
        "How long long polls waited for the LAC to move or their timeout "
        "[READ_ENTRY_LONG_POLL_WAIT]."
    ),
    "journal_flush_seconds": (
        "Journal write latency, a batch written apart from its fdatasync (an idle journal "
        "writes and syncs a lone small record in one call, timed as a sync) "
        "[JOURNAL_FLUSH_LATENCY]."
    ),
    "journal_sync_seconds": "Journal fdatasync latency (with the write, when one call does both) "
    "[JOURNAL_SYNC].",
    "journal_batch_entries": (
        "Records per journal write (group commit) [JOURNAL_FORCE_WRITE_BATCH_ENTRIES]."
    ),
    "journal_batch_bytes": (
        "Bytes per journal write (group commit) [JOURNAL_FORCE_WRITE_BATCH_BYTES]."
    ),
}

AUTORECOVERY_HELP: dict[str, str] = {
    "auditor_elections": "Times this process became the auditor.",
    "ledgers_marked": "Under-replicated marks this process's auditor made or widened.",
    "marks_cleared": "Marks dropped because their bookie came back or their ledger was deleted.",
    "ledgers_checked": "Ledgers the periodic check asked bookies about.",
    "under_replicated_ledgers": "Ledgers marked under-replicated and waiting for repair "
    "(the auditor's count).",
    "lost_ledgers": "Marked ledgers with entries no bookie has (the auditor's count).",
    "lost_bookies": "Bookies the auditor holds lost.",
    "bookies_registered": "Bookies registered (live), writable or read-only, as the auditor "
    "last read the registry.",
    "bookies_writable": "Writable bookies registered, as the auditor last read the registry.",
    "bookies_readonly": "Read-only bookies registered, as the auditor last read the registry.",
    "ledgers_marked_for_placement": "Ledgers this process's auditor marked because a write "
    "set spans fewer racks than min_racks_per_write_quorum and a move would spread it.",
    "misplaced_ledgers": "Ledgers marked for their placement alone, waiting for a worker "
    "(the auditor's count).",
    "ledgers_repaired": "Under-replicated marks this process's workers resolved.",
    "fragments_replicated": "Fragment copies this process's workers moved to a new bookie.",
    "entries_replicated": "Entries this process's workers copied to a new bookie.",
    "bytes_replicated": "Entry bytes this process's workers copied to a new bookie.",
    "ledgers_recovered": "Open ledgers a worker fenced and closed after the grace period.",
    "repair_failures": "Repairs that stopped (each retried after a backoff).",
    "placement_moves": "Copies this process's workers moved to another rack to spread a "
    "write set over min_racks_per_write_quorum racks.",
}

CLIENT_HELP: dict[str, str] = {
    "appends": "Appends confirmed to their caller.",
    "append_bytes": "Payload bytes of the appends confirmed.",
    "append_failures": "Appends failed (a fenced or closed ledger, a failed ensemble change, ...).",
    "ensemble_changes": "New fragments this client's writers put in the metadata "
    "[NUM_ENSEMBLE_CHANGE].",
    "recoveries": "Ledgers this client recovered (or found closed) when opening them.",
    "recovery_failures": "Ledger recoveries that failed (LedgerRecoveryError and others).",
    "entries_read": "Entries read and verified.",
    "speculative_reads": "Reads that asked a next bookie because the first was slow "
    "[SPECULATIVE_READ_COUNT].",
    "placement_short_of_racks": "Ensembles and replacements placed on fewer racks than "
    "min_racks_per_write_quorum asks (the cluster lacks them; not enforced).",
    "pending_appends": "Appends started and not finished yet [NUM_PENDING_ADD].",
    "pending_append_bytes": "Payload bytes of the appends started and not finished yet.",
    "appends_waiting": "Appends waiting for room in the client's budget of unfinished appends.",
    "append_seconds": "Append latency, from the entry id given to the confirmation [ADD_ENTRY].",
}

BUILD_INFO_HELP = "The aiobk version and Python version of this process (always 1)."
LOOP_LAG_HELP = (
    "How much later than scheduled the event loop woke a task sleeping 0.5 s (the loop's clock)."
)
METADATA_CONNECTED_HELP = (
    "1 while the last call to the metadata store (etcd) got through, 0 after one that could not."
)
