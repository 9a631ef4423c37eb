"""Decommissioning a bookie (``aiobk bookies decommission ID``): every copy it holds is made
again elsewhere, then its cookie goes, so nothing names it any more (BookKeeper's
``decommissionbookie``, on etcd).

Theory of operation. The operator's process does no copying itself: it asks the replication
workers (beside every bookie, or ``aiobk autorecovery start``) to do it, and watches.

1. Refuse what cannot end well, before changing anything: a bookie the store has never heard
   of; a ledger with a fragment that no writable bookie outside its ensemble could take the
   copies of (the drain would hang); and, when some ledger names the bookie, autorecovery
   disabled or no auditor elected (every autorecovery process stands for auditor, so none
   elected means no worker runs either). A bookie no ledger names needs no worker: a second
   run after a drain that ended waiting for the bookie to stop only removes its cookie.
2. Mark the bookie as decommissioning (workers then move its copies whatever a check would
   say, and read from it while it lives), and if it is registered ask it to turn read-only so
   new ensembles avoid it. Read-only is not persistent in the bookie, so a bookie restarted
   during the drain is asked again.
3. Walk every ledger (a page at a time) and mark each that names it under-replicated with
   reason ``DECOMMISSION``.
4. Wait until no ledger names it: each poll scans the marks (a mark naming the bookie is work
   not done yet) and reads only the ledgers whose mark no longer names it, marking again any
   that still does; once none is left a full walk confirms, and marks what a stale writer may
   have placed there meanwhile. Every ``explain_every`` seconds the progress names a few of
   the ledgers left and what holds each (``autorecovery.explain``, from the store alone).
5. A bookie still registered is drained but alive: removing its cookie under it would make its
   next boot refuse or start afresh, so wait for the operator to stop it (another budget of
   ``timeout``), then confirm once more that nothing names it.
6. Delete its cookie and the decommissioning key.

A timeout (or an interruption) leaves the bookie marked as decommissioning, on purpose: the
workers keep draining it, and running the command again picks up where it stands.
``cancel`` takes the mark away (and lifts read-only). Entries that had no other copy (a dead
bookie that held the only one) are reported, as the workers record them on the ledger's mark.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiobk.autorecovery.explain import explain, gather_facts
from aiobk.autorecovery.fragments import bookies_named
from aiobk.autorecovery.status import LostLedger
from aiobk.client import BookieConnection
from aiobk.metadata import DECOMMISSION, BookieServiceInfo, LedgerMetadata, MetadataStore
from aiobk.protocol import BookieStateRequest, StateChange
from aiobk.protocol.errors import BKError, MetadataVersionError, NoSuchLedgerError

POLL_INTERVAL = 1.0  # seconds between looks at the ledgers still naming the bookie
AUDITOR_WAIT = 15.0  # at most this long for an auditor to be elected (a failover takes a TTL)
STATE_TIMEOUT = 10.0  # for the bookie to answer a read-only request
SHOWN = 5  # ledger ids named in an error message, and ledgers explained in the progress
# A ledger left that nothing holds: its copy is under way, or waits for a worker's next look.
MOVING = "moving"
MOVING_REASON = "nothing holds it: a worker is copying it now, or takes it at its next look"
EXPLAIN_EVERY = 10.0  # seconds between explanations of the ledgers left


class DecommissionError(Exception):
    """The decommission cannot start or did not finish; the message is one line for the
    operator, saying what is left and what to do."""


@dataclass(frozen=True, slots=True)
class LedgerLeft:
    """A ledger that still names the bookie, and what holds its repair (the first blocker of
    its explanation; ``MOVING`` when nothing does)."""

    ledger_id: int
    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class Progress:
    stage: str  # "draining" (ledgers still name it) or "stopping" (waiting for it to stop)
    remaining: int  # ledgers that still name the bookie
    total: int  # ledgers marked so far
    note: str | None = None  # a notice to show once (read-only set, drained, ...)
    left: tuple[LedgerLeft, ...] = ()  # the latest explanation of a few ledgers left


@dataclass(frozen=True, slots=True)
class DecommissionResult:
    bookie_id: str
    ledgers: int  # ledgers that named it and were re-replicated
    was_registered: bool  # still alive once drained: the operator then stopped it
    cookie_removed: bool
    lost: tuple[LostLedger, ...] = ()  # entries found with no copy anywhere


Notify = Callable[[Progress], None]
SetState = Callable[[str, StateChange], Awaitable[None]]


async def ask_bookie_state(
    address: str, change: StateChange, timeout: float = STATE_TIMEOUT
) -> None:
    """Ask the bookie at ``address`` (host:port) to turn read-only or writable (the request
    ``aiobk bookie state`` sends); BKError when it cannot be reached or refuses."""
    host, _sep, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise DecommissionError(f"bookie address {address!r} is not host:port")
    conn = await BookieConnection.open(host, int(port), timeout=timeout)
    try:
        await conn.call(BookieStateRequest(0, change), timeout)
    finally:
        conn.close()


def stuck_fragments(
    metadata: LedgerMetadata, bookie_id: str, writable: Sequence[str]
) -> list[tuple[int, tuple[str, ...]]]:
    """The fragments (first entry, ensemble) naming ``bookie_id`` that no bookie in
    ``writable`` could take its copies for: a replacement must not be in the fragment's
    ensemble already (a copy of an entry per bookie)."""
    return [
        (fragment.first_entry_id, fragment.ensemble)
        for fragment in metadata.fragments
        if bookie_id in fragment.ensemble and not set(writable) - set(fragment.ensemble)
    ]


def _ids(ledgers: Sequence[int] | set[int]) -> str:
    shown = sorted(ledgers)[:SHOWN]
    more = len(ledgers) - len(shown)
    return ", ".join(map(str, shown)) + (f" and {more} more" if more > 0 else "")


class Decommission:
    def __init__(
        self,
        store: MetadataStore,
        bookie_id: str,
        *,
        timeout: float,
        wall_clock: Callable[[], float],
        notify: Notify | None = None,
        poll_interval: float = POLL_INTERVAL,
        auditor_wait: float = AUDITOR_WAIT,
        set_state: SetState = ask_bookie_state,
        explain_every: float = EXPLAIN_EVERY,
    ) -> None:
        """``set_state`` is the seam to the bookie (tests and the simulator replace it)."""
        if timeout <= 0 or poll_interval <= 0:
            raise ValueError("timeout and poll_interval must be positive")
        self._store = store
        self._recovery = store.autorecovery
        self.bookie_id = bookie_id
        self._timeout = timeout
        self._wall_clock = wall_clock
        self._notify = notify or (lambda _progress: None)
        self._poll = poll_interval
        self._auditor_wait = min(auditor_wait, timeout)
        self._set_state = set_state
        self._remaining: set[int] = set()
        self._marked: set[int] = set()  # every ledger marked, for the report of lost entries
        self._read_only_asked: str | None = None  # the registration version last asked
        self._explain_every = explain_every
        self._explained_at: float | None = None  # loop time of the last explanation
        self._left: tuple[LedgerLeft, ...] = ()
        self.draining = False  # marked as decommissioning (stays so if interrupted)

    # ------------------------------------------------------------------ the phases

    async def run(self) -> DecommissionResult:
        info = await self._preflight()
        await self._recovery.set_decommissioning(self.bookie_id, True)
        self.draining = True
        if info is not None:
            await self._keep_read_only(info)
        for ledger_id in await self._walk():
            await self._mark(ledger_id)
        self._report("draining")
        await self._drain()
        was_registered = await self._registration() is not None
        if was_registered:
            await self._wait_stopped()
            await self._drain()  # what a stale writer may have placed there meanwhile
            if await self._registration() is not None:
                raise DecommissionError(
                    f"bookie {self.bookie_id} registered again while being removed: stop it "
                    "for good, then run the command again"
                )
        removed = await self._remove_cookie()
        lost = await self._lost()
        await self._recovery.set_decommissioning(self.bookie_id, False)
        return DecommissionResult(self.bookie_id, len(self._marked), was_registered, removed, lost)

    async def _preflight(self) -> BookieServiceInfo | None:
        """Step 1 of the module docstring; the bookie's registration (None: not registered)."""
        recovery, bookie_id = self._recovery, self.bookie_id
        infos = await self._store.list_bookies()
        info = next((b for b in infos if b.bookie_id == bookie_id), None)
        draining = await recovery.decommissioning()
        known = (
            info is not None
            or bookie_id in draining
            or await self._store.read_cookie(bookie_id) is not None
        )
        writable = [
            b.bookie_id for b in infos if b.writable and b.bookie_id not in {bookie_id, *draining}
        ]
        named = stuck = 0
        example: tuple[int, int, tuple[str, ...]] | None = None
        async for ledger_id, metadata in self._store.scan_ledgers():
            if metadata is None or bookie_id not in bookies_named(metadata):
                continue
            named += 1
            blocked = stuck_fragments(metadata, bookie_id, writable)
            if blocked:
                stuck += 1
                example = example or (ledger_id, *blocked[0])
        if not known and not named:
            raise DecommissionError(
                f"unknown bookie {bookie_id!r}: not registered, no cookie, named in no ledger"
            )
        if example is not None:
            ledger_id, first, ensemble = example
            raise DecommissionError(
                f"cannot drain {bookie_id}: {stuck} ledger(s) have a fragment no writable "
                f"bookie could take its copies for (e.g. ledger {ledger_id} from entry {first} "
                f"on {', '.join(ensemble)}; writable elsewhere: {', '.join(writable) or 'none'});"
                " add bookies first"
            )
        if named:  # copies to move: the workers must be there (none needed to finish else)
            if not await recovery.enabled():
                raise DecommissionError(
                    "autorecovery is disabled: no worker would move the bookie's copies; run "
                    "`aiobk autorecovery enable` first"
                )
            await self._await_auditor()
        return info

    async def _await_auditor(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._auditor_wait
        while await self._recovery.auditor() is None:
            if loop.time() >= deadline:
                raise DecommissionError(
                    f"no autorecovery process is running (no auditor elected in "
                    f"{self._auditor_wait:g}s), so nothing would move the bookie's copies: "
                    "start bookies with autorecovery_enabled, or `aiobk autorecovery start`"
                )
            await asyncio.sleep(min(self._poll, 0.5))

    async def _walk(self) -> list[int]:
        """Every ledger naming the bookie now (a full walk, a page at a time)."""
        return [
            ledger_id
            async for ledger_id, metadata in self._store.scan_ledgers()
            if metadata is not None and self.bookie_id in bookies_named(metadata)
        ]

    async def _mark(self, ledger_id: int) -> None:
        now_ms = int(self._wall_clock() * 1000)
        await self._recovery.mark(ledger_id, [self.bookie_id], DECOMMISSION, now_ms)
        self._remaining.add(ledger_id)
        self._marked.add(ledger_id)

    async def _drain(self) -> None:
        """Step 4: until no ledger names the bookie, within ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        while True:
            started = loop.time()
            await self._look()
            last = self._explained_at
            if self._remaining and (last is None or started - last >= self._explain_every):
                self._explained_at = started
                self._left = await self.explain_left()
            if not self._remaining:
                for ledger_id in await self._walk():  # confirm; catch late arrivals
                    await self._mark(ledger_id)
                if not self._remaining:
                    self._report("draining")
                    return
            self._report("draining")
            if not await self._recovery.enabled():
                raise DecommissionError(
                    f"autorecovery was disabled while draining {self.bookie_id}: "
                    f"{len(self._remaining)} ledger(s) still name it "
                    f"({_ids(self._remaining)}); it stays marked for draining: run "
                    "`aiobk autorecovery enable`, then this command again"
                )
            info = await self._registration()
            if info is not None:
                await self._keep_read_only(info)
            if loop.time() >= deadline:
                raise DecommissionError(await self._timed_out())
            # A big drain takes long looks: spend at most half the time looking.
            await asyncio.sleep(max(self._poll, loop.time() - started))

    async def _look(self) -> None:
        """Which marked ledgers still name the bookie: one paged scan of the marks (a mark
        naming it is work not done yet); only a ledger whose mark no longer names it is read,
        and marked again if it still names the bookie (a mark gone by some race)."""
        pending: set[int] = set()
        async for mark in self._recovery.marks():
            if mark.ledger_id in self._remaining and self.bookie_id in mark.missing:
                pending.add(mark.ledger_id)
        for ledger_id in sorted(self._remaining - pending):
            try:
                metadata = await self._store.read_ledger(ledger_id)
            except NoSuchLedgerError:
                self._remaining.discard(ledger_id)
                continue
            if self.bookie_id in bookies_named(metadata) and not metadata.is_offloaded:
                await self._mark(ledger_id)
            else:  # moved off it, or held by its object store copy: no copy needed here
                self._remaining.discard(ledger_id)

    async def explain_left(self, count: int = SHOWN) -> tuple[LedgerLeft, ...]:
        """What holds the first ``count`` ledgers left (their explanations, store only)."""
        left = []
        for ledger_id in sorted(self._remaining)[:count]:
            explanation = explain(await gather_facts(self._store, ledger_id))
            if explanation.blockers:
                first = explanation.blockers[0]
                left.append(LedgerLeft(ledger_id, first.kind, first.message))
            else:  # named all the same: the first few left are the ones shown
                left.append(LedgerLeft(ledger_id, MOVING, MOVING_REASON))
        return tuple(left)

    async def _timed_out(self) -> str:
        """The timeout's message: what is left, and why some of it may stay (open ledgers)."""
        still = sorted(self._remaining)
        open_ = []
        for ledger_id in still[:1000]:  # a hint, not a census
            with contextlib.suppress(NoSuchLedgerError):
                if not (await self._store.read_ledger(ledger_id)).is_closed:
                    open_.append(ledger_id)
        hint = (
            f"; {len(open_)} open ({_ids(open_)}): a worker closes one after "
            "open_ledger_rereplication_grace_period, except with a MAC digest, which only its "
            "writer can"
            if open_
            else ""
        )
        why = "; ".join(f"ledger {x.ledger_id}: {x.reason}" for x in await self.explain_left(3))
        return (
            f"timed out after {self._timeout:g}s: {len(still)} ledger(s) still name "
            f"{self.bookie_id} ({_ids(still)}){hint}; it stays marked for draining and its "
            "copies keep moving: run the command again to wait "
            "(`aiobk autorecovery explain LEDGER_ID` says what holds one)"
            + (f"; what holds them: {why}" if why else "")
        )

    async def _wait_stopped(self) -> None:
        """Step 5: the bookie is drained but alive; wait for it to leave the registry."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        self._report(
            "stopping",
            f"{self.bookie_id} is drained: no ledger names it. Stop the bookie process now; "
            f"its cookie is removed once it has left the registry (waiting up to "
            f"{self._timeout:g}s)",
        )
        while (info := await self._registration()) is not None:
            await self._keep_read_only(info)
            if loop.time() >= deadline:
                raise DecommissionError(
                    f"{self.bookie_id} is drained (no ledger names it) but still registered "
                    f"after {self._timeout:g}s: stop it, then run the command again to remove "
                    "its cookie"
                )
            await asyncio.sleep(self._poll)

    async def _remove_cookie(self) -> bool:
        for _attempt in range(5):
            cookie = await self._store.read_cookie(self.bookie_id)
            if cookie is None:
                return False
            try:
                await self._store.delete_cookie(self.bookie_id, cookie.version)
            except MetadataVersionError:
                continue  # rewritten meanwhile (a boot): read again
            return True
        raise DecommissionError(f"the cookie of {self.bookie_id} keeps changing: is it running?")

    async def _lost(self) -> tuple[LostLedger, ...]:
        lost = []
        for ledger_id in sorted(self._marked):
            mark = await self._recovery.read_mark(ledger_id)
            if mark is not None and mark.lost:
                lost.append(LostLedger(ledger_id, mark.lost))
        return tuple(lost)

    # ------------------------------------------------------------------ helpers

    async def _registration(self) -> BookieServiceInfo | None:
        infos = await self._store.list_bookies()
        return next((b for b in infos if b.bookie_id == self.bookie_id), None)

    async def _keep_read_only(self, info: BookieServiceInfo) -> None:
        """Ask a registered bookie that shows writable to turn read-only: at the start, and
        again after a restart (its operator's read-only does not survive one). A bookie that
        cannot be asked is drained all the same; new ledgers may still pick it meanwhile."""
        if not info.writable or self._read_only_asked == f"{info.address}@{info.version}":
            return
        self._read_only_asked = f"{info.address}@{info.version}"
        try:
            await self._set_state(info.address, StateChange.READ_ONLY)
        except (BKError, DecommissionError) as exc:
            note = f"could not set {self.bookie_id} read-only ({exc}); draining it anyway"
            self._report("draining", note)
            return
        self._report("draining", f"{self.bookie_id} set read-only: new ledgers avoid it")

    def _report(self, stage: str, note: str | None = None) -> None:
        left = tuple(x for x in self._left if x.ledger_id in self._remaining)  # none done
        self._notify(Progress(stage, len(self._remaining), len(self._marked), note, left))


async def decommission(
    store: MetadataStore,
    bookie_id: str,
    *,
    timeout: float,
    wall_clock: Callable[[], float],
    notify: Notify | None = None,
    poll_interval: float = POLL_INTERVAL,
    auditor_wait: float = AUDITOR_WAIT,
    set_state: SetState = ask_bookie_state,
    explain_every: float = EXPLAIN_EVERY,
) -> DecommissionResult:
    """Drain ``bookie_id`` and remove it (the module docstring's six steps)."""
    return await Decommission(
        store,
        bookie_id,
        timeout=timeout,
        wall_clock=wall_clock,
        notify=notify,
        poll_interval=poll_interval,
        auditor_wait=auditor_wait,
        set_state=set_state,
        explain_every=explain_every,
    ).run()


@dataclass(frozen=True, slots=True)
class CancelResult:
    was_draining: bool
    asked_writable: bool = False  # it is registered read-only and was asked to turn writable
    problem: str | None = None  # why that request failed


async def cancel(
    store: MetadataStore, bookie_id: str, *, set_state: SetState = ask_bookie_state
) -> CancelResult:
    """Stop draining ``bookie_id``: its decommissioning key goes (marks already made are
    resolved by the workers, which ask it and find its copies in place, or copy what a dead
    one held), and if it is registered read-only it is asked to turn writable again."""
    recovery = store.autorecovery
    was = bookie_id in await recovery.decommissioning()
    await recovery.set_decommissioning(bookie_id, False)
    infos = await store.list_bookies()
    info = next((b for b in infos if b.bookie_id == bookie_id), None)
    if not was or info is None or info.writable:
        return CancelResult(was)
    try:
        await set_state(info.address, StateChange.WRITABLE)
    except (BKError, DecommissionError) as exc:
        return CancelResult(was, True, str(exc))
    return CancelResult(was, True)


__all__ = [
    "CancelResult",
    "Decommission",
    "DecommissionError",
    "DecommissionResult",
    "LedgerLeft",
    "Progress",
    "ask_bookie_state",
    "cancel",
    "decommission",
    "stuck_fragments",
]
