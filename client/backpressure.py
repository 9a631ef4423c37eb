"""Backpressure for appends: one budget of unfinished adds, and of their payload bytes, per client.

Theory of operation (after BookKeeper's client-wide ``maxAddsInProgress``; without a bound, an
application appending faster than its bookies took grew the client without limit):

- Every ``append()`` of a client takes one add and ``len(payload)`` bytes from its client's
  budget before it is given an entry id, and gives them back once its add is over: acknowledged
  or failed, and answered (or failed) by every bookie it was sent to, since until then a
  connection may still hold its frame (``AddPipeline``). The budget is shared by all of the
  client's ledger handles, so what queued appends cost in memory is bounded per process,
  whatever the number of handles; and a bookie slower than the rest of its write quorum can
  fall behind by at most the budget (the writer then goes at its pace, or replaces it once an
  add to it times out).
- Admission is strictly FIFO. An append that finds anyone waiting -- or admitted but not yet
  resumed -- queues behind them even if it would fit: entry ids follow call order, and a large
  append at the head is never starved by small ones behind it.
- A release admits from the head only as many waiters as now fit, and stops at the first that
  does not: O(1) per admitted append, whatever the queue length (the old scheme woke every
  waiter on every completion and removed them by value, O(n) each: a livelock at 100,000).
- A request larger than the byte limit can never fit beside others; it is admitted once nothing
  else is outstanding, and runs alone. (Entries over the frame limit are refused before they
  get here, see ``AddPipeline.check_size``.)
- Cancellation: a waiter cancelled before its turn is marked and skipped when the head reaches
  it (O(1), no search); since it may have been the head that blocked the others, the head is
  examined again. A waiter admitted but cancelled before it resumed gives its grant back, which
  passes the turn on to the next in line.

``AddBudget`` is the pure state machine (no asyncio); ``acquire`` is the thin async glue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

_WAITING, _ADMITTED, _CLAIMED, _CANCELLED = range(4)


class Waiter:
    """One queued request: ``wake`` is called once it is admitted (it then holds its grant)."""

    __slots__ = ("size", "state", "wake")

    def __init__(self, size: int, wake: Callable[[], None]) -> None:
        self.size = size
        self.wake = wake
        self.state = _WAITING

    @property
    def admitted(self) -> bool:
        return self.state in (_ADMITTED, _CLAIMED)


class AddBudget:
    """Counts unfinished adds and their bytes against two limits; queues the rest FIFO."""

    def __init__(self, max_adds: int, max_bytes: int) -> None:
        if max_adds <= 0 or max_bytes <= 0:
            raise ValueError("budget limits must be positive")
        self.max_adds = max_adds
        self.max_bytes = max_bytes
        self.adds = 0  # held now (admitted, claimed or not)
        self.bytes = 0
        self.waiting = 0  # queued, neither admitted nor cancelled
        self._handoffs = 0  # admitted but not yet claimed by their appender
        self._queue: deque[Waiter] = deque()

    def _fits(self, size: int) -> bool:
        if self.adds == 0:
            return True  # alone, whatever its size
        return self.adds < self.max_adds and self.bytes + size <= self.max_bytes

    def _take(self, size: int) -> None:
        self.adds += 1
        self.bytes += size

    def admit(self, size: int) -> bool:
        """Take ``size`` now if nobody is ahead and it fits; False means: queue with ``wait``."""
        if self.waiting or self._handoffs or not self._fits(size):
            return False
        self._take(size)
        return True

    def wait(self, size: int, wake: Callable[[], None]) -> Waiter:
        """Queue a request for ``size``; ``wake()`` runs when it is admitted (maybe at once)."""
        waiter = Waiter(size, wake)
        self._queue.append(waiter)
        self.waiting += 1
        self._admit_waiters()
        return waiter

    def claim(self, waiter: Waiter) -> None:
        """The admitted appender resumed: its grant is now an ordinary outstanding add."""
        if waiter.state == _ADMITTED:
            waiter.state = _CLAIMED
            self._handoffs -= 1

    def cancel(self, waiter: Waiter) -> None:
        """The appender went away: drop its place, or give back its grant if it had one."""
        if waiter.state == _WAITING:
            waiter.state = _CANCELLED
            self.waiting -= 1
            self._admit_waiters()  # it may have been the head that blocked the rest
        elif waiter.state == _ADMITTED:
            waiter.state = _CANCELLED
            self._handoffs -= 1
            self.release(1, waiter.size)

    def release(self, adds: int, size: int) -> None:
        """``adds`` unfinished adds of ``size`` bytes in all finished: admit who now fits."""
        self.adds -= adds
        self.bytes -= size
        if self.adds < 0 or self.bytes < 0:
            raise RuntimeError(f"budget released more than it lent ({self.adds}, {self.bytes})")
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        queue = self._queue
        while queue:
            head = queue[0]
            if head.state == _CANCELLED:
                queue.popleft()
                continue
            if not self._fits(head.size):
                return
            queue.popleft()
            self._take(head.size)
            head.state = _ADMITTED
            self.waiting -= 1
            self._handoffs += 1
            head.wake()


async def acquire(budget: AddBudget, size: int) -> None:
    """Wait for ``size`` bytes and one add from ``budget`` (FIFO, cancellation-safe)."""
    if budget.admit(size):
        return
    admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not admitted.done():
            admitted.set_result(None)

    waiter = budget.wait(size, wake)
    try:
        await admitted
    except BaseException:  # cancelled while waiting, or admitted then cancelled
        budget.cancel(waiter)
        raise
    budget.claim(waiter)
