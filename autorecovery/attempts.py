"""A worker's notes on the ledger it works on, for operators (``RepairAttempt`` in the store,
read by ``aiobk autorecovery explain``): what it is doing -- since when, how far the copying has
got, under which throttle -- and, when it stops short, why and when it tries again.

Notes are written under the worker's lease, so they go with the worker (as its backoff does),
and removed once the ledger is repaired. They cost etcd writes, so a repair that ends within
``PUBLISH_EVERY`` seconds writes none (its success only reads, to remove an earlier note);
a longer one is noted then and every ``PUBLISH_EVERY`` seconds, in the background; an attempt
that stops short is noted when it stops -- a deferral again only when its reason changes.
Writing one is best effort: a note that cannot be written never stops or slows a repair.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from aiobk.metadata import AutoRecoveryStore, RepairAttempt
from aiobk.metadata.autorecovery import FAILED, REPAIRING
from aiobk.tasks import TaskKeeper

log = logging.getLogger(__name__)

PUBLISH_EVERY = 2.0  # seconds before a repair under way is noted, and between its notes
REMEMBERED = 10_000  # ledgers whose last deferral is remembered (the oldest forgotten first)


class AttemptNotes:
    def __init__(
        self,
        marks: AutoRecoveryStore,
        worker_id: str,
        wall_clock: Callable[[], float],
        max_bytes_per_second: int,
    ) -> None:
        self._marks = marks
        self._worker_id = worker_id
        self._wall_clock = wall_clock
        self._rate = max_bytes_per_second
        self._current: RepairAttempt | None = None
        self._lease = 0
        self._pending = TaskKeeper()
        self._deferred: dict[int, tuple[str, str]] = {}  # ledger -> (state, kind) last noted
        self._noted = False  # this attempt has been noted while under way

    def _now_ms(self) -> int:
        return int(self._wall_clock() * 1000)

    def begin(self, ledger_id: int, lease: int, failures: int) -> None:
        """The worker has claimed ``ledger_id``: noted if the attempt lasts."""
        now = self._now_ms()
        self._lease = lease
        self._noted = False
        self._current = RepairAttempt(
            ledger_id,
            self._worker_id,
            now,
            failures=failures,
            updated=now,
            max_bytes_per_second=self._rate,
        )
        self._pending.spawn(self._publish_while_running(), name="attempt-notes")

    def to_copy(self, entries: int) -> None:
        """The attempt found ``entries`` more entries to copy."""
        if self._current is not None:
            self._current = dataclasses.replace(
                self._current, entries_to_copy=self._current.entries_to_copy + entries
            )

    def copied(self, size: int) -> None:
        """One more entry of ``size`` bytes copied."""
        current = self._current
        if current is None:
            return
        self._current = dataclasses.replace(
            current,
            entries_copied=current.entries_copied + 1,
            bytes_copied=current.bytes_copied + size,
        )

    async def end(self, state: str | None, kind: str = "", detail: str = "", *,
                  failures: int = 0, retry_in: float = 0.0) -> None:  # fmt: skip
        """The attempt is over: ``state`` FAILED or DEFERRED leaves a note saying why and when
        the worker tries again (``retry_in`` seconds); None (repaired, reported, gone) removes
        the note."""
        current, self._current = self._current, None
        await self._pending.cancel_and_wait(Exception)
        if current is None:
            return
        ledger_id = current.ledger_id
        if state is None:
            self._deferred.pop(ledger_id, None)
            try:
                await self._marks.clear_attempt(ledger_id)
            except Exception as exc:  # a note is for operators: never a reason to fail
                log.debug("worker %s: note not removed: %r", self._worker_id, exc)
            return
        if self._deferred.get(ledger_id) == (state, kind) and state != FAILED and not self._noted:
            return  # said already (a grace period is waited out one look after another)
        self._deferred.pop(ledger_id, None)  # re-inserted last: the newest
        self._deferred[ledger_id] = (state, kind)
        if len(self._deferred) > REMEMBERED:
            del self._deferred[next(iter(self._deferred))]
        now = self._now_ms()
        self._current = dataclasses.replace(
            current,
            state=state,
            kind=kind,
            detail=detail,
            failures=failures,
            retry_at=now + int(retry_in * 1000),
            updated=now,
        )
        try:
            await self._write()
        finally:
            self._current = None

    def abandon(self) -> None:
        """The attempt ended without ``end`` (cancelled, or an unexpected error): stop noting
        it. Its last note, if any, stays until its worker's lease goes."""
        self._current = None
        self._pending.cancel()

    async def _publish_while_running(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_EVERY)
            self._noted = True
            await self._write()

    async def _write(self) -> None:
        current = self._current
        if current is None:
            return
        if current.state == REPAIRING:
            current = dataclasses.replace(current, updated=self._now_ms())
        try:
            await self._marks.note_attempt(current, self._lease)
        except Exception as exc:  # a note is for operators: never a reason to fail a repair
            log.debug("worker %s: note not written: %r", self._worker_id, exc)


__all__ = ["PUBLISH_EVERY", "AttemptNotes"]
