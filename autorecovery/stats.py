"""Autorecovery's figures for operators (plain counters and gauges; the wiring exports them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class AutoRecoveryStats:
    # auditor
    auditor_elections: int = 0  # times this process became the auditor
    ledgers_marked: int = 0  # marks made or widened by this process's auditor
    marks_cleared: int = 0  # marks dropped: their bookie came back, their ledger was deleted
    ledgers_checked: int = 0  # ledgers the periodic check asked bookies about
    under_replicated_ledgers: int = 0  # gauge: marks waiting for repair (the auditor's count)
    lost_ledgers: int = 0  # gauge: marked ledgers with entries no bookie has
    lost_bookies: int = 0  # gauge: bookies the auditor holds lost
    bookies_registered: int = 0  # gauge: live bookies in the registry, as the auditor last read
    bookies_writable: int = 0  # gauge: ... of them writable
    bookies_readonly: int = 0  # gauge: ... of them read-only
    ledgers_marked_for_placement: int = 0  # marks made for write sets spanning too few racks
    misplaced_ledgers: int = 0  # gauge: marks for placement alone waiting for a worker
    # workers
    ledgers_repaired: int = 0  # marks a worker of this process resolved
    fragments_replicated: int = 0  # (fragment, bookie) copies moved to a new bookie
    entries_replicated: int = 0
    bytes_replicated: int = 0
    ledgers_recovered: int = 0  # open ledgers a worker fenced and closed after the grace period
    repair_failures: int = 0  # repairs that stopped (retried after a backoff)
    placement_moves: int = 0  # copies moved to another rack to spread a write set

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


__all__ = ["AutoRecoveryStats"]
