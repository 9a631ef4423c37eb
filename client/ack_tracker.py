"""Which entries in flight are acknowledged, in what order they complete, and the LAC: pure.

Theory of operation ("The BookKeeper protocol", "Writing to ledgers"; BookKeeper's "BP-14: Relax
durability", "LAC Advance Protocol"):

- Each entry in flight carries a bitmask of the ensemble slots that acknowledged it. An entry
  *completes* (its caller is answered) once it has ``ack_quorum`` acks and every entry before
  it has completed: completion is always in entry order, from the head of the queue.
- PERSISTENT ledgers: every ack is of an fdatasynced copy, so the LAC is the last completed
  entry, and the ledger's length is that entry's.
- VOLATILE ledgers (BP-14): acks are of written copies. The LAC moves by BP-14's rule over the
  LastAddSynced each slot reports -- the largest value at least WQ - AQ + 1 slots have reached
  -- and never past the last completed entry (or a ``ceiling``: a ``force()`` covers only what
  was completed before it began).
- An ensemble change makes the replaced slots' acks above the LAC count for nothing
  (``forget_slots``): those copies are on a bookie the new fragment does not name.

Nothing here sends, waits or resolves a future: ``AddPipeline`` (add.py) feeds acks in and
acts on what completed. The tracker works on any object with ``entry_id``, ``length``,
``acks`` and ``done`` (the pipeline's ``PendingAdd``).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar

from aiobk.client.quorum import lac_from_last_add_synced


class Tracked(Protocol):
    entry_id: int
    length: int  # the ledger's length including this entry
    acks: int  # bitmask of the slots that acknowledged it
    done: bool  # completed or failed


T = TypeVar("T", bound=Tracked)


class AckTracker(Generic[T]):
    __slots__ = (
        "_lengths",
        "aq",
        "lac",
        "lac_length",
        "last_acked",
        "pending",
        "synced",
        "volatile",
        "wq",
    )

    def __init__(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        *,
        volatile: bool = False,
        lac: int = -1,
        length: int = 0,
    ) -> None:
        self.wq, self.aq = write_quorum, ack_quorum
        self.volatile = volatile
        self.pending: deque[T] = deque()  # in flight, in entry order
        self.lac = lac
        self.lac_length = length
        self.last_acked = lac  # last entry completed (== lac unless VOLATILE)
        self.synced = [-1] * ensemble_size  # BP-14: LastAddSynced reported by each slot
        self._lengths: dict[int, int] = {}  # VOLATILE: lengths of completed entries above lac

    def track(self, entry: T) -> None:
        """``entry`` is the next one in flight (entries are tracked in id order)."""
        self.pending.append(entry)

    def ack(self, entry: T, slot: int) -> bool:
        """Slot ``slot`` acknowledged ``entry``; True when the head of the queue may now
        complete (``pop_ready`` has something to give). An ack of an entry already done (a
        late copy, or one of a failed ledger) changes nothing."""
        if entry.done:
            return False
        entry.acks |= 1 << slot
        return entry.acks.bit_count() >= self.aq and entry is self.pending[0]

    def pop_ready(self) -> list[T]:
        """Complete, in order, every entry at the head that has its ack quorum; they are
        marked done and the LAC moves (by BP-14's rule for VOLATILE)."""
        pending = self.pending
        aq = self.aq
        ready: list[T] = []
        while pending and pending[0].acks.bit_count() >= aq:
            entry = pending.popleft()
            entry.done = True
            ready.append(entry)
        if ready:
            last = ready[-1]
            self.last_acked = last.entry_id
            if self.volatile:
                for entry in ready:
                    self._lengths[entry.entry_id] = entry.length
                self.advance_volatile_lac()
            else:
                self.lac = last.entry_id
                self.lac_length = last.length
        return ready

    def synced_to(self, slot: int, last_add_synced: int) -> bool:
        """BP-14: slot ``slot`` reports it has synced up to ``last_add_synced``; True when
        that moved the LAC."""
        if last_add_synced <= self.synced[slot]:
            return False
        self.synced[slot] = last_add_synced
        before = self.lac
        return self.advance_volatile_lac() > before

    def advance_volatile_lac(self, ceiling: int | None = None) -> int:
        """BP-14: the LAC is the max of the WQ-AQ+1 lowest LastAddSynced values, never above
        the last completed add (or ``ceiling``, for force())."""
        candidate = lac_from_last_add_synced(self.synced, self.wq, self.aq)
        candidate = min(candidate, self.last_acked if ceiling is None else ceiling)
        if candidate > self.lac:
            self.lac = candidate
            lengths = self._lengths
            self.lac_length = lengths.get(candidate, self.lac_length)
            passed = []
            for entry in lengths:  # in entry order (completed in order): the passed come first
                if entry > candidate:
                    break
                passed.append(entry)
            for entry in passed:
                del lengths[entry]
        return self.lac

    def forget_slots(self, slots: list[int]) -> None:
        """An ensemble change replaces ``slots``: their acks of entries in flight (all above
        the LAC) no longer count."""
        mask = 0
        for slot in slots:
            mask |= 1 << slot
        for entry in self.pending:
            entry.acks &= ~mask

    def drain(self) -> deque[T]:
        """Every entry in flight, removed (the ledger failed); each is marked done."""
        pending, self.pending = self.pending, deque()
        for entry in pending:
            entry.done = True
        return pending


__all__ = ["AckTracker", "Tracked"]
