"""What the soak saw, recorded compactly: an hour at 400 records/s is 1.4 million acknowledged
records and as many reads, kept in arrays indexed by sequence (acknowledgements) and in read
order (reads) rather than as Python objects."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

NOT_ACKED = -1


@dataclass
class History:
    # By sequence: the position its acknowledgement gave (NOT_ACKED: none).
    ack_ledger: array[int] = field(default_factory=lambda: array("q"))
    ack_entry: array[int] = field(default_factory=lambda: array("q"))
    acked: int = 0
    last_ack: tuple[int, int] | None = None  # the highest acknowledged position
    # Latency (microseconds) of the acknowledgements by the minute of the run they came in.
    latency_by_minute: dict[int, array[int]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # sequence -> error
    called: int | None = None  # the writer's calls, from its final report
    unresolved: list[int] = field(default_factory=list)  # calls neither acked nor failed
    # In read order.
    read_seq: array[int] = field(default_factory=lambda: array("q"))
    read_ledger: array[int] = field(default_factory=lambda: array("q"))
    read_entry: array[int] = field(default_factory=lambda: array("q"))
    damaged: list[int] = field(default_factory=list)  # indexes of reads whose payload was wrong
    reader_errors: list[str] = field(default_factory=list)

    def ack(self, sequence: int, ledger: int, entry: int) -> None:
        if sequence >= len(self.ack_ledger):
            missing = sequence + 1 - len(self.ack_ledger)
            self.ack_ledger.extend([NOT_ACKED] * missing)
            self.ack_entry.extend([NOT_ACKED] * missing)
        if self.ack_ledger[sequence] == NOT_ACKED:
            self.acked += 1
        self.ack_ledger[sequence] = ledger
        self.ack_entry[sequence] = entry
        if self.last_ack is None or (ledger, entry) > self.last_ack:
            self.last_ack = (ledger, entry)

    def latency(self, minute: int, microseconds: int) -> None:
        self.latency_by_minute.setdefault(minute, array("q")).append(microseconds)

    def fail(self, sequence: int, error: str) -> None:
        self.failed[sequence] = error

    def read(self, sequence: int, ledger: int, entry: int, intact: bool) -> None:
        if not intact:
            self.damaged.append(len(self.read_seq))
        self.read_seq.append(sequence)
        self.read_ledger.append(ledger)
        self.read_entry.append(entry)

    def acked_position(self, sequence: int) -> tuple[int, int] | None:
        if 0 <= sequence < len(self.ack_ledger) and self.ack_ledger[sequence] != NOT_ACKED:
            return self.ack_ledger[sequence], self.ack_entry[sequence]
        return None

    def last_read(self) -> tuple[int, int] | None:
        """The position of the last record read."""
        if not self.read_seq:
            return None
        return self.read_ledger[-1], self.read_entry[-1]

    def caught_up(self) -> bool:
        """The reader has reached the highest acknowledged position (what it skipped on the
        way, ``checks`` finds)."""
        read = self.last_read()
        return self.last_ack is None or (read is not None and read >= self.last_ack)
