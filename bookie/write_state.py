"""Whether the bookie takes adds, and every reason it does not (BookKeeper's
BookieStateManager: writable, or read-only).

A read-only bookie refuses adds with EREADONLY -- a writer then changes its ensemble -- and
still serves reads, fences, LAC reads and long polls; it is registered read-only, so new
ledgers are placed elsewhere. Several things can make it read-only at once, each under its own
name (``OPERATOR``: ``aiobk bookie state --readonly``; ``DISK``: a directory over its usage
threshold or out of space; ``JOURNAL``: the journal failed), and it is writable again only
when every one of them has cleared.

Recovery adds (RECOVERY_ADD: BookKeeper's high-priority writes) are still taken while
read-only when ``high_priority`` holds: there is room (``min_usable_size_for_high_priority
_writes``) and the journal works. Recovery must be able to close a ledger whose ensemble holds
this bookie, or the ledger's acknowledged entries would stay one copy short.
"""

from __future__ import annotations

from collections.abc import Callable

OPERATOR = "operator"
DISK = "disk"
JOURNAL = "journal"


class WriteState:
    def __init__(self) -> None:
        self._reasons: dict[str, str] = {}
        self.room_for_high_priority = True  # set by the disk monitor
        self._listeners: list[Callable[[bool], None]] = []

    @property
    def writable(self) -> bool:
        return not self._reasons

    @property
    def high_priority(self) -> bool:
        """Recovery adds are taken (always when writable)."""
        return not self._reasons or (self.room_for_high_priority and JOURNAL not in self._reasons)

    @property
    def reasons(self) -> list[str]:
        return [f"{source}: {why}" for source, why in self._reasons.items()]

    def is_set(self, source: str) -> bool:
        return source in self._reasons

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """``listener(writable)`` runs whenever the bookie turns writable or read-only."""
        self._listeners.append(listener)

    def set(self, source: str, why: str) -> None:
        was = self.writable
        self._reasons[source] = why
        if was:
            self._notify()

    def clear(self, source: str) -> None:
        if self._reasons.pop(source, None) is not None and self.writable:
            self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            listener(self.writable)
