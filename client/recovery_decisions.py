"""Recovery's decisions, pure (BookKeeper's "Fencing" page; "A Guide to the BookKeeper Replication
Protocol", "Ledger Recovery"; BookKeeper's "BP-46: Running without the journal", "A note on
Quorums"; and the verified TLA+ model behind the guide, github.com/Vanlightly/bookkeeper-tlaplus).

``FenceTracker`` -- phase 1: fencing LAC reads to the last fragment's ensemble. Done once the
bookies that confirmed the fence cover every ack quorum; failed once enough have failed that
coverage can no longer happen. The recovery start point is
max(highest LAC seen, first entry of the last fragment - 1) (trap 2 of ``ProtocolSwitches``: a
bookie new to a fragment answers LAC -1; never restart a multi-fragment ledger at entry 0).

``ReadTracker`` -- phase 2, one entry read from its write set:
- recoverable at the first positive (the entry exists; recovery writes it back to an ack quorum
  before closing, so including it is safe even if the writer never acknowledged it). This is the
  TLA+ model's "generous on positives" rule and BookKeeper's: a single positive is written
  back before the close. AQ positives is sufficient but not necessary.
- absent at QC explicit negatives (NoSuchEntry/NoSuchLedger) and no positive: no ack quorum of
  the write set can hold it, so the writer never acknowledged it.
- unknown when every bookie answered (or failed) and neither happened: recovery must stop
  without closing (``{NoSuchEntry, timeout, timeout}`` must not close; ``{NoSuchEntry,
  NoSuchEntry, timeout}`` may).
"""

from __future__ import annotations

from enum import Enum

from aiobk.client.quorum import coverage_impossible, covered, quorum_coverage


class Outcome(Enum):
    PENDING = "pending"
    POSITIVE = "positive"
    NEGATIVE = "negative"
    UNKNOWN = "unknown"


class FenceTracker:
    def __init__(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        fragment_first_entry: int,
        use_floor: bool = True,
    ) -> None:
        self.e, self.wq, self.aq = ensemble_size, write_quorum, ack_quorum
        self.fenced: set[int] = set()
        self.failed: set[int] = set()
        self.max_lac = -1
        self.floor = fragment_first_entry - 1 if use_floor else -1

    def ok(self, slot: int, lac: int) -> Outcome:
        self.fenced.add(slot)
        self.failed.discard(slot)
        self.max_lac = max(self.max_lac, lac)
        return self.outcome()

    def fail(self, slot: int) -> Outcome:
        if slot not in self.fenced:
            self.failed.add(slot)
        return self.outcome()

    def outcome(self) -> Outcome:
        if covered(self.e, self.wq, self.aq, self.fenced):
            return Outcome.POSITIVE
        if coverage_impossible(self.e, self.wq, self.aq, self.failed):
            return Outcome.UNKNOWN
        return Outcome.PENDING

    @property
    def start_lac(self) -> int:
        """The LAC recovery starts after (and that its write-backs carry)."""
        return max(self.max_lac, self.floor)


class ReadTracker:
    def __init__(self, write_quorum: int, ack_quorum: int) -> None:
        self.wq = write_quorum
        self.qc = quorum_coverage(write_quorum, ack_quorum)
        self.positives = 0
        self.negatives = 0
        self.unknowns = 0

    def positive(self) -> Outcome:
        self.positives += 1
        return self.outcome()

    def negative(self) -> Outcome:
        self.negatives += 1
        return self.outcome()

    def unknown(self) -> Outcome:
        self.unknowns += 1
        return self.outcome()

    def outcome(self) -> Outcome:
        if self.positives:
            return Outcome.POSITIVE
        if self.negatives >= self.qc:
            return Outcome.NEGATIVE
        if self.positives + self.negatives + self.unknowns >= self.wq:
            return Outcome.UNKNOWN
        return Outcome.PENDING
