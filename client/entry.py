"""What readers get back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Entry:
    ledger_id: int
    entry_id: int
    data: bytes
