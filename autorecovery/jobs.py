"""What a replication worker (worker.py) does to one ledger, as values: the jobs it copies --
a slot moved to a new bookie, copies filled back in place, a move that spreads a fragment over
racks -- the outcome of a pass over a ledger, the error that makes it back off, and the
protection a test switches off."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aiobk.autorecovery.explain.model import ERROR
from aiobk.autorecovery.fragments import FragmentRange, owed_count
from aiobk.metadata import LedgerMetadata


@dataclass(frozen=True, slots=True)
class WorkerSwitches:
    """The protection a test switches off to show the checker catches its absence."""

    # Each fragment change is a compare-and-set on the version the worker read before copying.
    # Off, the worker writes its (possibly stale) view over whatever is there now, as a worker
    # that trusted its etcd lock would.
    metadata_version_fence: bool = True


class Outcome(enum.Enum):
    REPAIRED = "repaired"  # mark removed
    REPORTED = "reported"  # done, but entries are lost: the mark stays as the report
    GONE = "gone"  # the ledger was deleted: mark removed
    OFFLOADED = "offloaded"  # its object store copy holds it, not its bookies: mark removed
    DEFERRED = "deferred"  # not now (grace period, recovery in progress, a race): soon again
    FAILED = "failed"  # something was unreachable or nothing could take the copies: backoff


@dataclass(frozen=True, slots=True)
class Job:
    """One slot of one closed fragment: its copies moved to a new bookie (``fill`` None), or
    the entries in ``fill`` copied back onto the slot's own bookie, which lacks them; a move
    for placement chooses among ``targets`` only."""

    fragment: FragmentRange
    slot: int
    fill: tuple[int, ...] | None = None
    targets: tuple[str, ...] | None = None

    def size(self, metadata: LedgerMetadata) -> int:
        """How many entries the job copies."""
        if self.fill is not None:
            return len(self.fill)
        first, last = self.fragment.first, self.fragment.last
        return owed_count(first, last, self.slot, metadata.ensemble_size, metadata.write_quorum)


class RepairError(Exception):
    """This repair cannot finish now; the worker backs off and tries again. ``kind`` names
    why for operators (``aiobk.autorecovery.explain``)."""

    def __init__(self, message: str, kind: str = ERROR) -> None:
        super().__init__(message)
        self.kind = kind


__all__ = ["Job", "Outcome", "RepairError", "WorkerSwitches"]
