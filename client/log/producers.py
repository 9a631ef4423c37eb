"""A log's producers: what a writer learns of them when it takes the log, and what it keeps in
the log record (docs/design/logs.md, "Producers and exactly-once appends").

A producer is whoever appends to a log under a ``producer_id``, one writer at a time, numbering
its records with sequences that only go up. The log record keeps, for every producer, the last
sequence durably in the log and when the producer was last seen (``ProducerState``), as of the
start of ledger ``as_of``. A writer taking the log adds what happened since: the ledgers from
``as_of`` on that a producer wrote -- marked so in their custom metadata -- hold one producer
each, whose sequences rise with the entries, so their last entries are all there is to read.
What a writer reads when it opens is therefore bounded whatever the log's length, and every
roll moves ``as_of`` to the new ledger.

The table (``ProducerTable``) is pure; ``learn`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aiobk.client.log.format import RecordFormatError, decode
from aiobk.client.log.ledger_client import LedgerClient
from aiobk.metadata import LogMetadata, ProducerState
from aiobk.protocol.errors import NoSuchLedgerError

PRODUCER_KEY: Final = "producer"  # ledger custom metadata: the producer that wrote it
MAX_PRODUCERS: Final = 1000  # kept per log: past it, the ones seen longest ago are forgotten
DEFAULT_RETENTION: Final = 7 * 24 * 3600.0  # seconds a silent producer is remembered


class ProducerTable:
    """Each producer's last durable sequence and when it was last seen (milliseconds)."""

    def __init__(self, last: Mapping[str, tuple[int, int]] | None = None) -> None:
        self._last: dict[str, tuple[int, int]] = dict(last or {})

    def __len__(self) -> int:
        return len(self._last)

    def last_sequence(self, producer: str) -> int:
        """The producer's last sequence in the log; -1 when it has none."""
        return self._last.get(producer, (-1, 0))[0]

    def saw(self, producer: str, sequence: int, seen: int) -> None:
        """The producer's ``sequence`` is durable, and it was active at ``seen``."""
        old_sequence, old_seen = self._last.get(producer, (-1, seen))
        self._last[producer] = (max(sequence, old_sequence), max(seen, old_seen))

    def state(
        self, as_of: int, now: int, retention: int | None, keep: str | None = None
    ) -> ProducerState:
        """What the log record keeps as of ledger ``as_of``: producers not seen for longer
        than ``retention`` ms before ``now`` are forgotten (None: none is), and past
        ``MAX_PRODUCERS`` those seen longest ago; ``keep`` (the writer's own) never is."""
        kept = dict(self._last)
        if retention is not None:
            since = now - retention
            kept = {p: v for p, v in kept.items() if v[1] >= since or p == keep}
        if len(kept) > MAX_PRODUCERS:
            newest = sorted(kept, key=lambda p: (p != keep, -kept[p][1], p))[:MAX_PRODUCERS]
            kept = {p: kept[p] for p in newest}
        self._last = kept
        return ProducerState(as_of, dict(kept))


async def learn(bk: LedgerClient, record: LogMetadata, password: bytes, now: int) -> ProducerTable:
    """The producers of the log ``record`` describes, once no writer can add to it (its last
    ledgers fenced): the record's state, and the last entry of each producer's ledger from
    ``as_of`` on. A log no producer wrote to needs nothing read."""
    state = record.producers
    if state is None:
        return ProducerTable()
    table = ProducerTable(state.last)
    for ledger_id in record.ledgers:
        if ledger_id < state.as_of:
            continue
        try:
            handle = await bk.open_ledger(ledger_id, password, recovery=False)
        except NoSuchLedgerError:
            continue  # truncated away meanwhile
        last = handle.last_add_confirmed
        if PRODUCER_KEY not in handle.metadata.custom_metadata or last < 0:
            continue
        (entry,) = await handle.read(last, last)
        try:
            envelope = decode(entry.data)
        except RecordFormatError as exc:
            raise RecordFormatError(
                f"log {record.name!r}: the last entry of ledger {ledger_id}: {exc}"
            ) from None
        if envelope.producer_id is not None and envelope.sequence is not None:
            table.saw(envelope.producer_id, envelope.sequence, min(envelope.timestamp, now))
    return table


__all__ = ["DEFAULT_RETENTION", "MAX_PRODUCERS", "PRODUCER_KEY", "ProducerTable", "learn"]
