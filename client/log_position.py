"""Positions in a log: (ledger id, entry id), ordered. A log's ledgers are created one after
another and ledger ids only grow (metadata allocates them from etcd's revision), so the order
of positions is the order of the log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True, order=True)
class LogPosition:
    ledger_id: int
    entry_id: int

    EARLIEST: ClassVar[LogPosition]

    def next(self) -> LogPosition:
        """Where to resume reading after the record at this position."""
        return LogPosition(self.ledger_id, self.entry_id + 1)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> LogPosition:
        """The inverse of ``str()``: ``"LEDGER:ENTRY"``."""
        ledger, sep, entry = text.partition(":")
        try:
            if not sep:
                raise ValueError
            return cls(int(ledger), int(entry))
        except ValueError:
            raise ValueError(f"not a log position (LEDGER:ENTRY): {text!r}") from None


LogPosition.EARLIEST = LogPosition(-1, -1)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One record read from a log."""

    position: LogPosition
    data: bytes
