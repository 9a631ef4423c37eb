"""A bookie's figures of the moment, beside its counters (GET_BOOKIE_INFO, the metrics, HTTP
``/api/v1/bookie/info``)."""

from __future__ import annotations

from typing import Protocol

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.flow import FlowControl
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.storage import LedgerStorage
from aiobk.bookie.write_state import WriteState


class Measured(Protocol):
    """What the figures are read from (a ``Bookie``)."""

    config: BookieConfig
    flow: FlowControl
    journal: Journal
    storage: LedgerStorage
    write_state: WriteState

    @property
    def checkpoint_error(self) -> str | None: ...


def bookie_gauges(bookie: Measured) -> dict[str, int]:
    """The gauges' names and values now."""
    flow, journal, storage, config = bookie.flow, bookie.journal, bookie.storage, bookie.config
    return {
        "writable": int(bookie.write_state.writable),
        "high_priority_writes": int(bookie.write_state.high_priority),
        "checkpoint_failing": int(bookie.checkpoint_error is not None),
        "journal_failed": int(journal.failed is not None),
        "connections_open": len(flow.connections),
        "connection_bytes_held": flow.held,
        "add_bytes_in_progress": flow.add_bytes,
        "long_polls_waiting": flow.long_polls,
        "journal_queue_size": journal.queue_size,
        "journal_force_write_queue_size": journal.sync_queue_size,
        "ledgers_held": len(storage.ledgers),
        "ledger_states_in_use": storage.states_in_use,
        "write_cache_bytes": storage.write_cache_bytes,
        "write_cache_max_bytes": config.write_cache_max_size,
        "read_cache_bytes": storage.read_cache.size,
        "read_cache_max_bytes": config.read_cache_max_size,
    }


__all__ = ["Measured", "bookie_gauges"]
