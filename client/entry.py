"""What readers get back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry read from a ledger, its digest verified.

    Attributes:
        ledger_id: The ledger it belongs to.
        entry_id: Its id in the ledger (dense from 0).
        data: Its payload.
    """

    ledger_id: int
    entry_id: int
    data: bytes
