"""Opening a ledger with recovery: fence it, find its last entry, close it ("The BookKeeper
protocol", "Closing a ledger as a reader"; BookKeeper's "Fencing" page, "Fencing internals";
the three recovery phases of "A Guide to the BookKeeper Replication Protocol"). The traps
named are the known protocol traps, each one of ``ProtocolSwitches`` (docs/design/invariants.md).

1. IN_RECOVERY by compare-and-set, so the old writer's next ensemble change fails and it stops.
   A ledger already IN_RECOVERY (another recoverer, or one that died) is recovered as it is.
2. Fencing LAC reads (READ of entry -1 with FENCE and the master key) to the last fragment's
   ensemble until the fenced bookies cover every ack quorum: the old writer can no longer reach
   an ack quorum. Start after max(highest LAC, last fragment's first entry - 1) (trap 2).
3. Recovery reads from there on, each with FENCE too (trap 1: a bookie that missed the fencing
   read is fenced by the recovery read before it answers), to the write set in the ensemble as it
   was when recovery started. Outcomes per ``recovery_decisions``: a recoverable entry is written
   back with RECOVERY_ADD carrying the LAC frozen at the start (trap 4); an absent one ends the
   ledger; an unknown one aborts recovery without closing (``LedgerRecoveryError``, retriable).
   A write-back failure changes the ensemble locally only (trap 3).
4. Once every write-back has an ack quorum, compare-and-set CLOSED with the last entry, its
   length and the local fragments. If another client closed it first, its result is adopted.
"""

from __future__ import annotations

import asyncio
import logging

from aiobk.client.add import AddMode, AddPipeline
from aiobk.client.context import ClientContext
from aiobk.client.digest import Digester
from aiobk.client.ensemble_change import ReplacementsChosen
from aiobk.client.entry_read import ask, verified
from aiobk.client.quorum import write_set
from aiobk.client.read import EntryReader
from aiobk.client.recovery_decisions import FenceTracker, Outcome, ReadTracker
from aiobk.metadata import LedgerMetadata, LedgerState
from aiobk.protocol import (
    LAC_ENTRY_ID,
    ReadFlag,
    ReadRequest,
    ReadResponse,
    StatusCode,
)
from aiobk.protocol.errors import (
    BKError,
    DigestMismatchError,
    LedgerRecoveryError,
    MetadataVersionError,
    UnauthorizedError,
)
from aiobk.tasks import cancel_all

log = logging.getLogger(__name__)


class LedgerRecovery:
    def __init__(
        self, ctx: ClientContext, *, ledger_id: int, master_key: bytes, digest: Digester
    ) -> None:
        self.ledger_id = ledger_id
        self._ctx = ctx
        self._key = master_key
        self._digest = digest
        self._store = ctx.store
        self._pool = ctx.pool
        self._config = ctx.config
        self._rng = ctx.rng
        self._bad: set[str] = set()  # bookies that failed a write-back: never chosen again

    async def run(self, metadata: LedgerMetadata) -> LedgerMetadata:
        stats = self._ctx.stats
        try:
            metadata = await self._mark_in_recovery(metadata)
            if not metadata.is_closed:
                start = await self._fence(metadata)
                last, length = await self._read_and_write_back(metadata, start)
                metadata = await self._close(last, length)
        except BKError:
            stats.recovery_failures += 1
            raise
        stats.recoveries += 1
        return metadata

    # ------------------------------------------------------------------ phase 0

    async def _mark_in_recovery(self, metadata: LedgerMetadata) -> LedgerMetadata:
        for _attempt in range(self._config.metadata_retries):
            if metadata.state is not LedgerState.OPEN:
                return metadata
            try:
                return await self._store.write_ledger(self.ledger_id, metadata.in_recovery())
            except MetadataVersionError:
                metadata = await self._store.read_ledger(self.ledger_id)
        raise LedgerRecoveryError(f"ledger {self.ledger_id}: could not mark it IN_RECOVERY")

    # ------------------------------------------------------------------ phase 1

    async def _fence(self, metadata: LedgerMetadata) -> int:
        fragment = metadata.last_fragment
        tracker = FenceTracker(
            metadata.ensemble_size,
            metadata.write_quorum,
            metadata.ack_quorum,
            fragment.first_entry_id,
            use_floor=self._config.switches.recovery_start_floor,
        )
        decided: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        auth_error: list[UnauthorizedError] = []

        async def fence_one(slot: int, bookie: str) -> None:
            try:
                conn = await self._pool.get(bookie)
                request = ReadRequest(
                    conn.next_txn_id(), self.ledger_id, LAC_ENTRY_ID, ReadFlag.FENCE, self._key
                )
                response = await conn.send(request, self._config.read_timeout)
            except BKError as exc:
                log.info("ledger %d: fence of %s failed: %s", self.ledger_id, bookie, exc)
                outcome = tracker.fail(slot)
            else:
                assert isinstance(response, ReadResponse)
                if response.status is StatusCode.EOK:
                    outcome = tracker.ok(slot, response.lac)
                else:
                    if response.status is StatusCode.EUA:
                        auth_error.append(
                            UnauthorizedError(f"bookie {bookie} refused the password")
                        )
                    outcome = tracker.fail(slot)
            if outcome is not Outcome.PENDING and not decided.done():
                decided.set_result(outcome)

        tasks = [
            asyncio.ensure_future(fence_one(slot, bookie))
            for slot, bookie in enumerate(fragment.ensemble)
        ]
        try:
            outcome = await decided
        finally:
            # Answers after coverage only add more fenced bookies; let them land meanwhile.
            for task in tasks:
                if not task.done():
                    task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
        if auth_error:
            raise auth_error[0]
        if outcome is not Outcome.POSITIVE:
            raise LedgerRecoveryError(
                f"ledger {self.ledger_id}: too few bookies of {list(fragment.ensemble)} "
                f"answered the fence (fenced {sorted(tracker.fenced)})"
            )
        return tracker.start_lac

    # ------------------------------------------------------------------ phase 2

    async def _recovery_read(
        self, metadata: LedgerMetadata, entry_id: int
    ) -> tuple[Outcome, bytes, int]:
        """Ask the entry's write set (recovery ensemble) with FENCE; decide per ReadTracker."""
        fragment = metadata.fragment_for(entry_id)
        slots = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
        tracker = ReadTracker(metadata.write_quorum, metadata.ack_quorum)
        loop = asyncio.get_running_loop()
        decided: asyncio.Future[tuple[Outcome, bytes, int]] = loop.create_future()

        async def read_one(bookie: str) -> None:
            outcome = Outcome.PENDING
            found = (b"", 0)
            fence = self._config.switches.recovery_reads_fence
            try:
                response = await ask(
                    self._pool,
                    bookie,
                    self.ledger_id,
                    entry_id,
                    self._config.read_timeout,
                    ReadFlag.FENCE if fence else ReadFlag.NONE,
                    self._key if fence else b"",
                )
            except BKError:
                outcome = tracker.unknown()
            else:
                if response.status is StatusCode.EOK and response.body is not None:
                    try:
                        parsed = verified(
                            response.body, self._digest, self.ledger_id, entry_id, bookie
                        )
                    except DigestMismatchError:
                        outcome = tracker.unknown()  # a damaged copy proves nothing
                    else:
                        found = (parsed.payload, parsed.length)
                        outcome = tracker.positive()
                elif response.status.is_explicit_negative:
                    outcome = tracker.negative()
                else:
                    outcome = tracker.unknown()
            if outcome is not Outcome.PENDING and not decided.done():
                decided.set_result((outcome, *found))

        tasks = [asyncio.ensure_future(read_one(fragment.ensemble[s])) for s in slots]
        try:
            return await decided
        finally:
            for task in tasks:
                if not task.done():
                    task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _read_and_write_back(self, metadata: LedgerMetadata, start: int) -> tuple[int, int]:
        self._local = metadata
        length = 0
        if start >= 0:
            reader = EntryReader(self.ledger_id, self._digest, self._pool, self._config)
            try:
                length = await self._entry_length(reader, metadata, start)
            except BKError as exc:
                raise LedgerRecoveryError(
                    f"ledger {self.ledger_id}: cannot read entry {start} (the LAC): {exc}"
                ) from exc
        pipeline = AddPipeline(
            self._ctx,
            ledger_id=self.ledger_id,
            master_key=self._key,
            digest=self._digest,
            metadata=metadata,
            change_ensemble=self._change_locally,
            mode=AddMode.recovery(start),
            lac=start,
            length=length,
        )
        try:
            last, length = await self._scan(metadata, start, length, pipeline)
            await pipeline.settle()
            if pipeline.error is not None:
                raise LedgerRecoveryError(
                    f"ledger {self.ledger_id}: write-back failed: {pipeline.error}"
                ) from pipeline.error
            return last, length
        except BaseException as exc:
            # Write-backs still in flight would stay pending for good (their answers are
            # ignored once the pipeline closes): they fail with the recovery.
            if pipeline.error is None:
                reason = exc if isinstance(exc, LedgerRecoveryError) else None
                pipeline.fail(
                    reason or LedgerRecoveryError(f"ledger {self.ledger_id}: stopped: {exc!r}")
                )
            raise
        finally:
            await pipeline.close()

    async def _entry_length(self, reader: EntryReader, metadata: LedgerMetadata, entry: int) -> int:
        return (await reader.fetch(metadata, entry)).length

    async def _scan(
        self, metadata: LedgerMetadata, start: int, length: int, pipeline: AddPipeline
    ) -> tuple[int, int]:
        """Read forward from start + 1 with a window of reads in flight, deciding in order."""
        window = self._config.recovery_read_window
        reads: dict[int, asyncio.Task[tuple[Outcome, bytes, int]]] = {}
        next_read = start + 1
        entry = start + 1
        last = start
        try:
            while True:
                while next_read < entry + window:
                    reads[next_read] = asyncio.ensure_future(
                        self._recovery_read(metadata, next_read)
                    )
                    next_read += 1
                outcome, payload, entry_length = await reads.pop(entry)
                if outcome is Outcome.NEGATIVE:
                    return last, length
                if outcome is not Outcome.POSITIVE:
                    raise LedgerRecoveryError(
                        f"ledger {self.ledger_id}: cannot tell whether entry {entry} exists "
                        "(too few bookies answered); try again once they are back"
                    )
                op = pipeline.add_entry(entry, payload, entry_length)
                op.future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
                if pipeline.error is not None:
                    raise LedgerRecoveryError(str(pipeline.error)) from pipeline.error
                last, length = entry, entry_length
                entry += 1
        finally:
            await cancel_all(reads.values())

    async def _change_locally(
        self,
        first_entry: int,
        ensemble: list[str],
        failed: dict[int, str],
        chosen: ReplacementsChosen | None,
    ) -> list[str]:
        """Trap 3: recovery's ensemble changes reach the metadata only with the close. (No CAS
        to wait for, so ``chosen`` has nothing to be early for: the return is the moment.)"""
        # Every bookie that failed so far stays excluded: excluding only this round's would
        # let two failing bookies replace each other forever (found by the simulator).
        self._bad.update(failed.values())
        candidates = await self._pool.writable_bookies(fresh=True)
        new = list(ensemble)
        for slot in sorted(failed):
            new[slot] = self._ctx.replacement(
                candidates,
                new,
                self._bad,
                slot,
                self._local.write_quorum,
                f"ledger {self.ledger_id}: recovery",
            )
        self._local = self._local.with_fragment(first_entry, tuple(new))
        if not self._config.switches.recovery_changes_local:
            self._local = await self._store.write_ledger(self.ledger_id, self._local)
        return new

    # ------------------------------------------------------------------ phase 3

    async def _close(self, last: int, length: int) -> LedgerMetadata:
        closing = self._local.closed(last, length)
        try:
            return await self._store.write_ledger(self.ledger_id, closing)
        except MetadataVersionError:
            current = await self._store.read_ledger(self.ledger_id)
            if current.is_closed:
                return current  # another recoverer (or the writer) closed it: adopt that
            raise LedgerRecoveryError(
                f"ledger {self.ledger_id} changed during recovery; try again"
            ) from None
