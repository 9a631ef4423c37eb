"""The replication worker: takes one under-replicated ledger at a time and gives every closed
fragment its copies back (BookKeeper's ReplicationWorker, on etcd).

One ledger, as the worker sees it:

1. Claim it (a key under the worker's lease) so other workers leave it alone -- a courtesy, not
   a guarantee: a worker whose lease lapsed may still be running, so every change below is a
   compare-and-set on the version read (``metadata.lease``).
2. Read its metadata. Gone: the ledger was deleted, drop the mark. IN_RECOVERY: someone is
   recovering it, come back later -- unless that has lasted the grace period of step 4.
3. Decide which (fragment, bookie) pairs to replace, closed fragments only: a bookie the mark
   names and the registry does not (the auditor names a bookie only once it has been gone for
   ``lost_bookie_recovery_delay``), a bookie being decommissioned, and a registered bookie the
   mark names that, asked again, lacks entries it owes. A named bookie that came back holding
   its entries is dropped from the mark (pulsar#1886: returning bookies' ledgers were copied
   anyway).
4. A ledger still open whose writer's fragment names a lost bookie: the writer normally changes
   its ensemble by itself; once ``open_ledger_rereplication_grace_period`` has passed since the
   mark, recover it (fence and close, as a reader opening it would) and go on with it closed.
5. For each pair: choose a replacement as a writer would (writable, not in that fragment's
   ensemble, not known bad), copy the entries the slot owes (``replicate.SlotCopy``), then
   compare-and-set the fragment's ensemble. A fragment changed meanwhile by someone else is
   left to the next pass (its copy is orphaned and garbage collected with the ledger).
6. A mark for placement (``spread``), or copies moved in step 5: move one copy at a time of a
   closed fragment whose write set spans too few racks to a bookie of another rack, chosen as
   a replacement is among those that spread it, copied and swapped as in step 5, until no
   move spreads it further.
7. Remove the mark at the version read (if the auditor widened it meanwhile, it stays for the
   next pass). Entries no bookie has any more are recorded on the mark instead and the ledger
   is not tried again for them (apache/bookkeeper#4872). So are entries whose every copy is
   damaged: one failing its digest at once; one answered EIO (a checksum failing on disk, or
   a disk failing for a moment) once ``DAMAGED_ATTEMPTS`` attempts met nothing else.

A repair that fails (no bookie to copy to, a source or target unreachable, the store down) is
retried after ``rereplication_retry_delay``, doubling up to 32 times it, per ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from aiobk.autorecovery.attempts import AttemptNotes
from aiobk.autorecovery.checker import Holding, absent_entries, holds
from aiobk.autorecovery.config import AutoRecoveryConfig
from aiobk.autorecovery.explain.model import (
    CHANGED,
    DAMAGED,
    ERROR,
    GRACE,
    NO_KEY,
    NO_TARGET,
    WRITER_ONLY,
)
from aiobk.autorecovery.fragments import (
    FragmentRange,
    bookies_named,
    check_points,
    closed_fragments,
    open_fragment,
    replace_bookie,
    slot_entries,
)
from aiobk.autorecovery.jobs import Job, Outcome, RepairError, WorkerSwitches
from aiobk.autorecovery.replicate import (
    CopyError,
    DamagedCopyError,
    SlotCopy,
    Throttle,
    fetch_master_key,
)
from aiobk.autorecovery.spread import cluster_spread, next_move
from aiobk.autorecovery.stats import AutoRecoveryStats
from aiobk.client.context import ClientContext
from aiobk.client.digest import Digester
from aiobk.client.recovery import LedgerRecovery
from aiobk.metadata import (
    CHECK,
    PLACEMENT,
    HeldLease,
    LedgerMetadata,
    LedgerState,
    UnderReplication,
)
from aiobk.metadata.autorecovery import DEFERRED, FAILED
from aiobk.metadata.kv import KeyMissingError
from aiobk.protocol import DigestType
from aiobk.protocol.errors import (
    BKError,
    MetadataVersionError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)
from aiobk.protocol.keys import stand_in_key

log = logging.getLogger(__name__)

MAX_BACKOFF_DOUBLINGS = 5
MAX_BACKOFF_ENTRIES = 10_000  # ledgers remembered as failing (the oldest forgotten first)
# Attempts at a ledger that meet only damaged copies (EIO) of some entry before the last one
# reports such entries lost: a disk failing for a moment answers EIO too, and a report is for
# good (the backoff puts rereplication_retry_delay, then twice that, between them).
DAMAGED_ATTEMPTS = 3
ALL_ON = WorkerSwitches()  # every protection on: what runs outside the tooth tests


class ReplicationWorker:
    def __init__(
        self,
        ctx: ClientContext,
        config: AutoRecoveryConfig,
        worker_id: str,
        *,
        stats: AutoRecoveryStats | None = None,
        wall_clock: Callable[[], float],
        secret_bytes: Callable[[int], bytes],
        switches: WorkerSwitches = ALL_ON,
        poll_interval: float = 2.0,
    ) -> None:
        self._ctx = ctx
        self._store = ctx.store
        self._marks = ctx.store.autorecovery
        self._config = config
        self.worker_id = worker_id
        self.stats = stats or AutoRecoveryStats()
        self._wall_clock = wall_clock
        self._secret_bytes = secret_bytes
        self._switches = switches
        self._poll = poll_interval
        self._secret: bytes | None = None
        self._lease: HeldLease | None = None
        self._backoff: dict[int, tuple[int, float]] = {}  # ledger -> (failures, not before)
        self._damaged: dict[int, int] = {}  # ledger -> attempts that met only damaged copies
        self._cursor: int | None = None  # the last ledger taken: the next pass starts after it
        loop = asyncio.get_running_loop()
        self._throttle = Throttle(config.rereplication_max_bytes_per_second, loop.time)
        self._notes = AttemptNotes(
            self._marks, worker_id, wall_clock, config.rereplication_max_bytes_per_second
        )
        self._why = ("", "")  # (kind, words) of the last attempt that stopped short

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Repair marked ledgers until cancelled."""
        try:
            while True:
                try:
                    worked = await self.run_once()
                except Exception as exc:  # the store unreachable (or a bug): keep trying
                    log.warning("worker %s: %r", self.worker_id, exc)
                    worked = False
                if not worked:
                    await asyncio.sleep(self._poll * (0.5 + self._ctx.rng.random()))
        finally:
            if self._lease is not None:
                with contextlib.suppress(BKError):
                    await self._lease.close()

    async def run_once(self) -> bool:
        """Claim and repair one marked ledger; False when there was none to take."""
        if not await self._marks.enabled():
            return False
        lease = await self._held_lease()
        taken = await self._take(lease)
        if taken is None:
            return False
        mark, claim, failures = taken
        try:
            self._notes.begin(mark.ledger_id, lease.id, failures)
            self._why = ("", "")
            outcome = await self._attempt(mark)
            wait = self._note(mark.ledger_id, outcome, failures)
            state = {Outcome.FAILED: FAILED, Outcome.DEFERRED: DEFERRED}.get(outcome)
            failed = failures + (outcome is Outcome.FAILED)
            await self._notes.end(state, *self._why, failures=failed, retry_in=wait)
        finally:
            self._notes.abandon()  # after ``end``, nothing left to stop
            await self._marks.release(mark.ledger_id, claim)
        return True

    async def _take(self, lease: HeldLease) -> tuple[UnderReplication, int, int] | None:
        """The next mark with work to do, not backing off, claimed: (mark, claim version,
        failures so far). Marks are walked from after the last one taken, wrapping once, so
        workers spread over them and none is starved."""
        loop = asyncio.get_running_loop()
        for wrapped in (False, True):
            after = None if wrapped else self._cursor
            async with contextlib.aclosing(self._marks.marks(after_ledger=after)) as marks:
                async for mark in marks:
                    if wrapped and self._cursor is not None and mark.ledger_id > self._cursor:
                        break
                    if not mark.missing and (PLACEMENT not in mark.reasons or mark.lost):
                        continue  # a report of lost entries: nothing left to do
                    failures, not_before = self._backoff.get(mark.ledger_id, (0, 0.0))
                    if loop.time() < not_before:
                        continue
                    try:
                        claim = await self._marks.claim(mark.ledger_id, self.worker_id, lease.id)
                    except KeyMissingError:  # the lease went before its keeper noticed
                        await self._drop_lease()
                        return None
                    if claim is not None:
                        self._cursor = mark.ledger_id
                        return mark, claim, failures
        return None

    async def _drop_lease(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            with contextlib.suppress(BKError):
                await lease.close()

    async def _held_lease(self) -> HeldLease:
        lease = self._lease
        if lease is None or lease.lost.is_set():
            lease = self._lease = await HeldLease.grant(
                self._store.kv, self._config.autorecovery_lease_ttl, f"worker {self.worker_id}"
            )
        return lease

    def _note(self, ledger_id: int, outcome: Outcome, failures: int) -> float:
        """Book the outcome; the seconds before this worker takes the ledger again."""
        now = asyncio.get_running_loop().time()
        delay = self._config.rereplication_retry_delay
        if outcome is Outcome.FAILED:
            self.stats.repair_failures += 1
            wait = delay * float(2 ** min(failures, MAX_BACKOFF_DOUBLINGS))
            self._backoff.pop(ledger_id, None)  # re-inserted last: the newest
            self._backoff[ledger_id] = (failures + 1, now + wait)
            if len(self._backoff) > MAX_BACKOFF_ENTRIES:
                del self._backoff[next(iter(self._backoff))]
            return wait
        if outcome is Outcome.DEFERRED:
            self._backoff[ledger_id] = (failures, now + delay)
            return delay
        self._backoff.pop(ledger_id, None)
        self._damaged.pop(ledger_id, None)
        if outcome not in (Outcome.GONE, Outcome.OFFLOADED):
            self.stats.ledgers_repaired += 1
        return 0.0

    async def _attempt(self, mark: UnderReplication) -> Outcome:
        ledger_id = mark.ledger_id
        seen = self._damaged.get(ledger_id, 0)
        try:
            return await self.repair(mark, damaged_is_lost=seen + 1 >= DAMAGED_ATTEMPTS)
        except DamagedCopyError as exc:
            self._damaged.pop(ledger_id, None)  # re-inserted last: the newest
            self._damaged[ledger_id] = seen + 1
            if len(self._damaged) > MAX_BACKOFF_ENTRIES:
                del self._damaged[next(iter(self._damaged))]
            self._why = (DAMAGED, f"{exc} (attempt {seen + 1} of {DAMAGED_ATTEMPTS})")
            log.warning(
                "worker %s: ledger %d not repaired yet (attempt %d of %d before its damaged "
                "entries are reported lost): %s",
                self.worker_id, ledger_id, seen + 1, DAMAGED_ATTEMPTS, exc,
            )  # fmt: skip
            return Outcome.FAILED
        except (RepairError, CopyError, BKError) as exc:
            self._why = (getattr(exc, "kind", ERROR), str(exc))
            log.warning(
                "worker %s: ledger %d not repaired yet: %s", self.worker_id, mark.ledger_id, exc
            )
            return Outcome.FAILED

    # ------------------------------------------------------------------ one ledger

    async def repair(self, mark: UnderReplication, *, damaged_is_lost: bool = False) -> Outcome:
        """Steps 2-6 of the module docstring for one claimed ledger (``damaged_is_lost``: an
        entry whose sources answer only EIO is lost, not a ``DamagedCopyError``)."""
        ledger_id, store = mark.ledger_id, self._store
        try:
            metadata = await store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            await self._marks.unmark(mark)
            return Outcome.GONE
        if metadata.is_offloaded:
            # Its object store copy is complete: readers fall back to it, and the bookies
            # drop theirs once it is released, so copies on bookies need no repair.
            await self._marks.unmark(mark)
            return Outcome.OFFLOADED
        infos = await store.list_bookies()
        await self._ctx.pool.writable_bookies(fresh=True)  # the racks replacements spread over
        registered = {info.bookie_id for info in infos}
        writable = [info.bookie_id for info in infos if info.writable]
        draining = await self._marks.decommissioning()
        missing = set(mark.missing)
        lost = {b for b in missing if b not in registered}
        moving = lost | draining  # copies to move whatever a check would say

        tail = open_fragment(metadata)
        recovered_from: int | None = None
        # IN_RECOVERY: someone is recovering it -- or was, and stopped (a reader that died, or
        # a recovery of ours that could not fence enough bookies): left to them for the grace
        # period, then recovered here like an open ledger.
        stalled = metadata.state is LedgerState.IN_RECOVERY
        if tail is not None and (stalled or moving & set(tail.ensemble)):
            waited = self._wall_clock() - mark.since / 1000
            if waited < self._config.open_ledger_rereplication_grace_period:
                return self._deferred(
                    ledger_id, GRACE, f"open, {waited:.3f}s into its grace period"
                )
            metadata = await self._recover(ledger_id, metadata, registered, lost)
            recovered_from = tail.first_entry_id

        jobs: list[Job] = []
        for fragment in closed_fragments(metadata):
            for slot, bookie in enumerate(fragment.ensemble):
                if bookie in moving:
                    jobs.append(Job(fragment, slot))
                    continue
                # Recovery closes a ledger once its write-backs reach an ack quorum: what it
                # wrote may lack the rest of its copies, on bookies that are fine.
                written = recovered_from is not None and fragment.first >= recovered_from
                if bookie in registered and (bookie in missing or written):
                    # A check found copies missing (or a recovery wrote these): ask about every
                    # entry, not a sample -- after a fill cut short, the first and last may be
                    # back while some between are not. A lost bookie that came back is asked
                    # about its first and last only (it holds all or nothing, or repairs itself
                    # with BP-46).
                    scan_all = written or CHECK in mark.reasons
                    fill = await self._lacking(ledger_id, metadata, fragment, slot, scan_all)
                    if fill:
                        jobs.append(Job(fragment, slot, tuple(fill)))
                    # none lacking: a bookie that came back with its copies keeps them

        lost_ranges: list[tuple[int, int]] = []
        self._notes.to_copy(sum(job.size(metadata) for job in jobs))
        found: list[bytes] = []
        fetching = asyncio.Lock()

        async def key() -> bytes:  # fetched once, when a first entry is to be written
            async with fetching:  # by one of the copies in flight; the others wait
                if not found:
                    holders = registered  # a bookie being drained has the key too
                    found.append(await self._master_key(ledger_id, metadata, holders))
            return found[0]

        if jobs:
            for job in jobs:
                done = await self._run_job(
                    ledger_id, metadata, job, key, writable, registered, moving, mark,
                    damaged_is_lost,
                )  # fmt: skip
                if done is None:  # the ledger changed under us: look again soon
                    return self._deferred(
                        ledger_id, CHANGED, "its fragment changed during the copy"
                    )
                metadata, ranges = done
                lost_ranges.extend(ranges)

        still = moving & bookies_named(metadata)
        if still:  # e.g. a lost bookie still in the writer's fragment
            return self._deferred(ledger_id, CHANGED, f"still names {', '.join(sorted(still))}")
        # Step 6, also after copies moved for other reasons (their targets spread only as far
        # as one slot could); each move raises a bounded score, so there are few.
        if PLACEMENT in mark.reasons or any(job.fill is None for job in jobs):
            spread = cluster_spread(infos, self._config.min_racks_per_write_quorum)
            targets = set(writable) - draining
            for _move in range(sum(len(f.ensemble) for f in metadata.fragments) * 3):
                move = next_move(metadata, spread, targets)
                if move is None:  # spread as far as the racks allow: the mark goes
                    break
                job = Job(move.fragment, move.slot, targets=move.targets)
                self._notes.to_copy(job.size(metadata))
                done = await self._run_job(
                    ledger_id, metadata, job, key, writable, registered, moving, mark,
                    damaged_is_lost,
                )  # fmt: skip
                if done is None:
                    return self._deferred(ledger_id, CHANGED, "its fragment changed during a move")
                metadata, ranges = done
                lost_ranges.extend(ranges)
                self.stats.placement_moves += 1
        try:
            if lost_ranges or mark.lost:
                report = dataclasses.replace(mark, missing=()).with_lost(lost_ranges)
                await self._marks.write_mark(report)
                log.error(
                    "ledger %d: entries %s have no copy left on any bookie",
                    ledger_id, report.lost,
                )  # fmt: skip
                return Outcome.REPORTED
            await self._marks.unmark(mark)
        except MetadataVersionError:  # the auditor widened the mark meanwhile: another pass
            return self._deferred(ledger_id, CHANGED, "its mark changed")
        return Outcome.REPAIRED

    def _deferred(self, ledger_id: int, kind: str, why: str) -> Outcome:
        log.debug("worker %s: ledger %d deferred: %s", self.worker_id, ledger_id, why)
        self._why = (kind, why)
        return Outcome.DEFERRED

    async def _lacking(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        fragment: FragmentRange,
        slot: int,
        scan_all: bool,
    ) -> list[int]:
        """The entries a registered bookie lacks in one fragment slot: asked about its check
        points first (unless ``scan_all``), then, if one is missing, about every entry it owes.
        RepairError when it cannot be asked now."""
        ctx, config = self._ctx, self._config
        bookie = fragment.ensemble[slot]
        timeout = ctx.config.read_timeout
        if not scan_all:
            points = check_points(
                fragment, slot, metadata, config.auditor_ledger_verification_percentage, ctx.rng
            )
            holding = await holds(ctx.pool, bookie, ledger_id, points, timeout)
            if holding is Holding.HELD:
                return []
            if holding is Holding.UNKNOWN:
                raise RepairError(f"could not ask {bookie} what it holds")
        e, wq = metadata.ensemble_size, metadata.write_quorum
        owed = slot_entries(fragment.first, fragment.last, slot, e, wq)
        absent, unsure = await absent_entries(
            ctx.pool, bookie, ledger_id, owed, timeout, config.rereplication_entries_in_flight
        )
        if unsure:
            raise RepairError(f"could not ask {bookie} about all it holds")
        return absent

    async def _recover(
        self, ledger_id: int, metadata: LedgerMetadata, holders: set[str], lost: set[str]
    ) -> LedgerMetadata:
        """Fence and close an open ledger whose writer's ensemble lost a bookie (``holders``:
        the registered bookies, ``lost``: the bookies gone for good)."""
        if metadata.digest_type is DigestType.MAC:
            # Recovery re-signs what it writes back (trap 4): a MAC needs the password.
            raise RepairError(
                "an open ledger with a MAC digest: only its writer can close it", WRITER_ONLY
            )
        key, never_held = await self._fetch_key(ledger_id, metadata, holders)
        # Only if every bookie the ledger names was asked or is gone for good: one that is
        # merely down now may hold the only copies of acknowledged entries.
        # And only if fewer bookies of its writer's ensemble are lost than an ack quorum: else
        # an acknowledged entry may have lived on lost bookies alone, and closing the ledger
        # empty would hide that loss.
        unasked = bookies_named(metadata) - holders - lost
        writer = set(metadata.fragments[-1].ensemble)
        if key is None and never_held and not unasked and len(writer & lost) < metadata.ack_quorum:
            # No bookie still here ever took an entry of it, so none can have been acknowledged
            # (an ack needs an ack quorum, on more bookies than were lost), and nobody left knows
            # its key: fence it with a stand-in key -- a fence creates the ledger fenced on a
            # bookie that never saw it -- and close it empty. Its writer, if it ever writes,
            # meets fenced bookies (UnauthorizedError) and a closed ledger. The stand-in is made
            # with the cluster's secret: a bookie checks a fence of a ledger it does not hold
            # against the key digest in the metadata, and lets this one through
            # only because it proves the secret (``protocol.keys.stand_in_key``).
            assert self._secret is not None  # read by _fetch_key
            key = stand_in_key(self._secret, ledger_id)
        if key is None:
            raise RepairError(f"no bookie of ledger {ledger_id} gave its master key", NO_KEY)
        recovery = LedgerRecovery(
            self._ctx,
            ledger_id=ledger_id,
            master_key=key,
            digest=Digester(metadata.digest_type),
        )
        closed = await recovery.run(metadata)
        self.stats.ledgers_recovered += 1
        log.info("worker %s: recovered open ledger %d", self.worker_id, ledger_id)
        return closed

    async def _fetch_key(
        self, ledger_id: int, metadata: LedgerMetadata, holders: set[str]
    ) -> tuple[bytes | None, bool]:
        if self._secret is None:
            self._secret = await self._marks.cluster_secret(self._secret_bytes)
        assert self._secret is not None
        sources = sorted(bookies_named(metadata) & holders)
        timeout = self._ctx.config.read_timeout
        return await fetch_master_key(self._ctx.pool, sources, ledger_id, self._secret, timeout)

    async def _master_key(
        self, ledger_id: int, metadata: LedgerMetadata, holders: set[str]
    ) -> bytes:
        key, _never_held = await self._fetch_key(ledger_id, metadata, holders)
        if key is None:
            raise RepairError(f"no bookie of ledger {ledger_id} gave its master key", NO_KEY)
        return key

    async def _run_job(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        job: Job,
        key: Callable[[], Awaitable[bytes]],
        writable: list[str],
        registered: set[str],
        moving: set[str],
        mark: UnderReplication,
        damaged_is_lost: bool,
    ) -> tuple[LedgerMetadata, list[tuple[int, int]]] | None:
        """Copy one slot to a new bookie and swap it in (or fill a bookie's gaps in place): the
        metadata as it now is and the entry ranges found lost; None when the fragment changed
        under us."""
        ctx = self._ctx
        fragment, slot = job.fragment, job.slot
        if job.fill is None:
            exclude = moving | ctx.pool.recently_failed()
            try:
                target = ctx.replacement(
                    writable if job.targets is None else job.targets,
                    fragment.ensemble,
                    exclude,
                    slot,
                    metadata.write_quorum,
                    f"ledger {ledger_id}: re-replication",
                )
            except NotEnoughBookiesError as exc:
                raise RepairError(str(exc), NO_TARGET) from None
        else:
            target = fragment.ensemble[slot]
        copy = SlotCopy(
            ctx.pool,
            ledger_id,
            metadata,
            fragment,
            slot,
            target,
            key,
            usable=lambda bookie: bookie in registered,
            lost_bookies=moving - registered,
            skip=mark.lost,
            only=job.fill,
            timeout=ctx.config.add_timeout,
            in_flight=self._config.rereplication_entries_in_flight,
            throttle=self._throttle,
            damaged_is_lost=damaged_is_lost,
            on_copied=self._notes.copied,
        )
        result = await copy.run()
        if job.fill is None:
            written = await self._swap(ledger_id, metadata, fragment, slot, target)
            if written is None:
                return None
            metadata = written
            self.stats.fragments_replicated += 1
        stats = self.stats
        stats.entries_replicated += result.entries
        stats.bytes_replicated += result.bytes
        log.info(
            "worker %s: ledger %d entries %d-%d of %s %s %s (%d entries, %d bytes)",
            self.worker_id, ledger_id, fragment.first, fragment.last, fragment.ensemble[slot],
            "copied to" if job.fill is None else "filled on", target, result.entries,
            result.bytes,
        )  # fmt: skip
        return metadata, result.lost

    async def _swap(
        self,
        ledger_id: int,
        read: LedgerMetadata,
        fragment: FragmentRange,
        slot: int,
        target: str,
    ) -> LedgerMetadata | None:
        """Compare-and-set the fragment's ensemble with ``target`` in ``slot``, re-reading on
        a lost race while the fragment is still as copied; None once it is not."""
        store, fence = self._store, self._switches.metadata_version_fence
        current = read
        for _attempt in range(self._ctx.config.metadata_retries):
            wanted = replace_bookie(current if fence else read, fragment, slot, target)
            if wanted is None:
                return None
            try:
                if not fence:  # the switched-off protection: write the stale view over it
                    latest = await store.read_ledger(ledger_id)
                    wanted = wanted.with_version(latest.version)
                return await store.write_ledger(ledger_id, wanted)
            except MetadataVersionError:
                current = await store.read_ledger(ledger_id)
                if current.state is LedgerState.IN_RECOVERY:
                    return None
        return None


__all__ = ["DAMAGED_ATTEMPTS", "Outcome", "RepairError", "ReplicationWorker", "WorkerSwitches"]
