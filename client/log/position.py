"""Positions in a log: (ledger id, entry id), ordered. A log's ledgers are created one after
another and ledger ids only grow (metadata allocates them from etcd's revision), so the order
of positions is the order of the log.

Text form (``str()`` and ``LogPosition.parse``, what the CLI prints and takes): ``LEDGER:ENTRY``
in decimal, e.g. ``12:0`` for the first record of ledger 12, and ``earliest`` for
``LogPosition.EARLIEST``, before every record of any log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from aiobk.client.log.format import RAW, RecordFormatError, decode

_TEXT = re.compile(r"([0-9]+):([0-9]+)", re.ASCII)


@dataclass(frozen=True, slots=True, order=True)
class LogPosition:
    """A record's place in a log: (ledger id, entry id), ordered as the log is.

    ``str()`` gives ``LEDGER:ENTRY`` (what the CLI prints and takes) and ``parse`` reads it
    back, so a position stored as a checkpoint resumes a reader exactly:
    ``open_log_reader(name, start=LogPosition.parse(saved).next())``.

    Attributes:
        ledger_id: The ledger holding the record.
        entry_id: The record's entry id in that ledger.
        EARLIEST: Before every record of any log (``earliest``).
    """

    ledger_id: int
    entry_id: int

    EARLIEST: ClassVar[LogPosition]

    def next(self) -> LogPosition:
        """Where to resume reading after the record at this position.

        Returns:
            The position of the next entry of the same ledger (a reader moves on to the next
            ledger by itself when this one has no such entry).
        """
        return LogPosition(self.ledger_id, self.entry_id + 1)

    def __str__(self) -> str:
        if self == LogPosition.EARLIEST:
            return "earliest"
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> LogPosition:
        """The inverse of ``str()``.

        Args:
            text: ``"LEDGER:ENTRY"`` (non-negative decimals) or ``"earliest"``.

        Returns:
            The position.

        Raises:
            ValueError: ``text`` is in neither form (the message names the form).
        """
        if text.strip().lower() == "earliest":
            return cls.EARLIEST
        match = _TEXT.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"not a log position (LEDGER:ENTRY or earliest): {text!r}")
        return cls(int(match[1]), int(match[2]))


LogPosition.EARLIEST = LogPosition(-1, -1)


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record read from a log.

    Attributes:
        position: Where it is in the log.
        data: Its payload.
        key: The key its writer gave (envelope logs), else None.
        headers: Its headers, name to bytes (envelope logs), else empty.
        timestamp: Milliseconds since the epoch (envelope logs), else None.
        producer_id: The producer that appended it (a writer opened with one), else None.
        sequence: Its sequence number from that producer, else None.
    """

    position: LogPosition
    data: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=dict)
    timestamp: int | None = None
    producer_id: str | None = None
    sequence: int | None = None


# The former name of LogRecord, kept so that code written against it still runs; ``aiobk.client``
# warns (DeprecationWarning) when it is looked up there.
LogEntry = LogRecord


def log_record(position: LogPosition, body: bytes, record_format: str) -> LogRecord:
    """The record stored as ``body`` in a log of ``record_format``; in an envelope log,
    RecordFormatError naming the position when ``body`` is no envelope."""
    if record_format == RAW:
        return LogRecord(position, body)
    try:
        record = decode(body)
    except RecordFormatError as exc:
        raise RecordFormatError(f"the record at {position}: {exc}") from None
    return LogRecord(
        position,
        record.data,
        record.key,
        record.headers,
        record.timestamp,
        record.producer_id,
        record.sequence,
    )
