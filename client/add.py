"""Adding entries: BookKeeper's PendingAddOp and the ordering rules around it.

Theory of operation ("The BookKeeper protocol" and "A Guide to the BookKeeper Replication Protocol",
both "Writing to ledgers"):

- ``add`` gives the next entry id (dense, in call order), encodes the entry once -- the body
  carries the LAC at send time -- and sends the same frame to every bookie of its write set.
- An entry is acknowledged to its caller when AQ bookies of its write set acked it *and* every
  lower entry has been acknowledged; the LAC is the last entry so acknowledged.
- A bookie that fails an add (error, timeout, unreachable) starts an ensemble change: its slot
  gets a replacement in a new fragment starting at LAC + 1, acks it gave above the LAC no longer
  count, every unacknowledged entry of its slots is sent again to the replacement, and no entry
  is acknowledged until the new fragment is durable (``change_ensemble`` returned) -- an entry
  acked by a bookie that the metadata does not name yet would be invisible to recovery
  (``ProtocolSwitches.hold_acks_during_change``). Failures that arrive before
  a change starts merge into it; later ones make another round. New adds wait until it is done.
- EFENCED means a recovery has started: every pending and later add fails with
  ``LedgerFencedError``; EUA fails them with ``UnauthorizedError``; ENOLEDGER means the bookie's
  garbage collector dropped the ledger after it was deleted, so they fail with
  ``NoSuchLedgerError`` (no ensemble change: the replacement would recreate a deleted ledger).
  Any other status (EREADONLY from a bookie whose disk is full, EIO, ...) is a bookie failure.
- Appends of a ``LedgerHandle`` hold a share of their client's ``AddBudget`` (backpressure.py)
  from before they get an entry id until they are finished (acknowledged or failed) *and* every
  bookie they were sent to has answered or failed: until then the bookie's connection may still
  hold the frame (an entry acknowledged at AQ < WQ is still being written to the slowest bookie),
  so the budget bounds what the client holds, and a slow bookie can lag the others by at most
  the budget. Recovery's write-backs hold none.

VOLATILE ledgers (BookKeeper's "BP-14: Relax durability", "LAC Advance Protocol"): an add completes
at AQ *written* copies, in order, but the LAC moves only by BP-14's rule over the LastAddSynced each
bookie reports (never past the last completed add), and a failing bookie fails the ledger's adds
instead of changing the ensemble ("Ensemble changes are not allowed ... when ledgerType is not
PD_JOURNAL").

The same pipeline writes recovery's write-backs (``AddMode.recovery``: RECOVERY_ADD, a fixed LAC
in every body, and a ``change_ensemble`` that only changes the local view: traps 3 and 4 of
``ProtocolSwitches``).

The parts: ``ack_tracker`` counts acks, orders completions and moves the LAC (pure);
``add_batches`` frames the entries and batches them per bookie and loop turn, over the pool's
``Sender`` (frames in order per bookie, through a backlog while a connection is being made);
``ensemble_change.EnsembleChange`` runs the rounds of ensemble changes; ``lac.ExplicitLac``
tells idle bookies the last LAC; this module takes the adds, reacts to answers and completes
them in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiobk.client.ack_tracker import AckTracker
from aiobk.client.add_batches import AddBatcher, PendingAdd
from aiobk.client.backpressure import AddBudget
from aiobk.client.context import ClientContext
from aiobk.client.digest import Digester
from aiobk.client.ensemble_change import EnsembleChange, EnsembleChanger
from aiobk.client.lac import ExplicitLac
from aiobk.client.quorum import write_set
from aiobk.metadata import LedgerMetadata
from aiobk.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    AddBatchResponse,
    AddFlag,
    AddResponse,
    BatchError,
    Durability,
    Response,
    StatusCode,
    unpack_statuses,
)
from aiobk.protocol.errors import (
    BKError,
    BookieUnavailableError,
    EntryTooLargeError,
    LedgerFencedError,
    NoSuchLedgerError,
    OperationTimeoutError,
    UnauthorizedError,
)
from aiobk.tasks import TaskKeeper

log = logging.getLogger(__name__)

# What an add request frame holds besides the payload and the master key, at most: the msgpack
# array, tag and five integers (9 bytes each), two bin headers, the entry header and the
# largest digest (HMAC-SHA256). A test checks that a payload of exactly the resulting limit
# goes through a real encoder and bookie.
ADD_FRAME_OVERHEAD = 1 + 1 + 5 * 9 + 3 + 5 + HEADER_SIZE + 32


@dataclass(frozen=True, slots=True)
class AddMode:
    """How a pipeline writes: as the ledger's writer, or as recovery writing entries back."""

    flags: AddFlag = AddFlag.NONE
    durability: Durability = Durability.PERSISTENT
    fixed_lac: int | None = None  # recovery: the LAC every body carries (trap 4)
    budgeted: bool = True  # appends hold a share of the client's AddBudget (backpressure.py)

    @classmethod
    def writer(cls, durability: Durability = Durability.PERSISTENT) -> AddMode:
        return cls(AddFlag.NONE, durability, None, True)

    @classmethod
    def recovery(cls, lac: int) -> AddMode:
        """Write-backs: RECOVERY_ADD (a fenced bookie takes them), always synced -- even for a
        volatile ledger: the close that follows promises every entry up to the last is on an
        ack quorum (I3), and a write-back may change the ensemble locally, which BP-14's
        no-change rule is not about (it binds writers) -- and no budget."""
        return cls(AddFlag.RECOVERY_ADD, Durability.PERSISTENT, lac, False)


class AddPipeline:
    """The adds of one ledger handle (or one recovery's write-backs): entry ids, the ack
    tracker and the LAC, completion in order, failures. Frames leave through its
    ``AddBatcher``; a failed bookie's slot is replaced by its ``EnsembleChange``."""

    def __init__(
        self,
        ctx: ClientContext,
        *,
        ledger_id: int,
        master_key: bytes,
        digest: Digester,
        metadata: LedgerMetadata,
        change_ensemble: EnsembleChanger,
        mode: AddMode,
        lac: int = -1,
        length: int = 0,
    ) -> None:
        """Adds to the last fragment of ``metadata``, the next entry after ``lac`` (a ledger
        of ``length`` bytes so far)."""
        self.ledger_id = ledger_id
        self._digest = digest
        self.e, self.wq = metadata.ensemble_size, metadata.write_quorum
        # Entry e's slots are those of e mod E: E write sets, computed once, not per add.
        self._write_sets = [tuple(write_set(i, self.e, self.wq)) for i in range(self.e)]
        self.ensemble = list(metadata.ensemble)
        self._pool = ctx.pool
        self._config = config = ctx.config
        self.volatile = mode.durability is Durability.VOLATILE
        self._tracker: AckTracker[PendingAdd] = AckTracker(
            metadata.ensemble_size,
            metadata.write_quorum,
            metadata.ack_quorum,
            volatile=self.volatile,
            lac=lac,
            length=length,
        )
        self.next_entry_id = lac + 1
        self.length = length
        self._frozen_lac = mode.fixed_lac if config.switches.recovery_frozen_lac else None
        self.error: BKError | None = None
        # add() is called holding a share of the budget, given back at the end
        self._budget: AddBudget | None = ctx.budget if mode.budgeted else None
        # The client's figures count a writer's appends, not recovery's write-backs.
        self._stats = None if mode.flags & AddFlag.RECOVERY_ADD else ctx.stats
        self.max_payload = DEFAULT_MAX_FRAME_SIZE - ADD_FRAME_OVERHEAD - len(master_key)
        self._idle: list[asyncio.Future[None]] = []
        self._loop = asyncio.get_running_loop()
        self._tasks = TaskKeeper()
        self._batcher = AddBatcher(
            ctx.pool,
            config.add_timeout,
            ledger_id,
            master_key,
            mode.flags,
            mode.durability,
            on_response=self._on_response,
            on_batch=self._on_batch,
            answered=self._answered,
            failed=lambda: self.error is not None,
        )
        self._change = EnsembleChange(
            self,
            self._tracker,
            self._write_sets,
            config,
            change_ensemble,
            ledger_id=ledger_id,
            send=self._send,
            complete_ready=self._complete_ready,
            spawn=self._tasks.spawn,
        )
        # The slots being replaced, read on every answer: the change's own dict.
        self._failed = self._change.failed
        # Recovery's write-backs carry their frozen LAC and need no explicit one.
        self._explicit = (
            ExplicitLac(ledger_id, master_key, ctx.pool, config, lac)
            if mode.fixed_lac is None
            else None
        )

    # ------------------------------------------------------------------ state

    @property
    def lac(self) -> int:
        return self._tracker.lac

    @property
    def lac_length(self) -> int:
        return self._tracker.lac_length

    @property
    def last_acked(self) -> int:
        """The last add completed to its caller (== lac unless VOLATILE)."""
        return self._tracker.last_acked

    @property
    def synced(self) -> list[int]:
        """BP-14: the LastAddSynced each slot reported."""
        return self._tracker.synced

    def advance_volatile_lac(self, ceiling: int | None = None) -> int:
        return self._tracker.advance_volatile_lac(ceiling)

    @property
    def outstanding(self) -> int:
        return len(self._tracker.pending)

    @property
    def changing(self) -> bool:
        """An ensemble change is under way: acknowledgements are held, new adds wait."""
        return self._change.changing

    # ------------------------------------------------------------------ adding

    def check_size(self, payload: bytes) -> None:
        """Refuse, before it takes an entry id, a payload whose add would not fit in a frame."""
        if len(payload) > self.max_payload:
            raise EntryTooLargeError(
                f"ledger {self.ledger_id}: an entry of {len(payload)} bytes does not fit in one "
                f"add request (at most {self.max_payload} bytes of payload with this ledger's "
                f"key, frames are limited to {DEFAULT_MAX_FRAME_SIZE} bytes)"
            )

    def add(self, payload: bytes) -> PendingAdd:
        """Start adding ``payload`` as the next entry; its future gives the entry id. With a
        budget, the caller holds one add and ``len(payload)`` bytes of it (handed over here:
        released when the add completes or fails, or now if it cannot start)."""
        try:
            if self.error is not None:
                raise self.error
            self.check_size(payload)
        except BKError:
            if self._budget is not None:
                self._budget.release(1, len(payload))
            raise
        entry_id = self.next_entry_id
        self.next_entry_id = entry_id + 1
        self.length += len(payload)
        return self._start(entry_id, payload, self.length, charged=self._budget is not None)

    def add_entry(self, entry_id: int, payload: bytes, length: int) -> PendingAdd:
        """Recovery: write back a specific entry (ids must follow on)."""
        if self.error is not None:
            raise self.error
        if entry_id != self.next_entry_id:
            raise ValueError(f"entry {entry_id} is not the next one ({self.next_entry_id})")
        self.next_entry_id = entry_id + 1
        self.length = length
        return self._start(entry_id, payload, length)

    def _start(
        self, entry_id: int, payload: bytes, length: int, charged: bool = False
    ) -> PendingAdd:
        op = PendingAdd(entry_id, payload, length, self._loop.create_future())
        op.charged = charged
        if self._stats is not None:
            op.started = self._stats.clock()
        self._tracker.track(op)
        change = self._change
        if change.changing and not change.sent_early:
            op.queued = True
            change.queued.append(op)
        else:
            self._send(op, self._write_sets[entry_id % self.e])
        return op

    def _send(self, op: PendingAdd, slots: Sequence[int]) -> None:
        """Send ``op`` to the bookies of ``slots`` (add_batches.py: at once when it is alone in
        flight, else batched); the entry as sent carries the LAC as it is now (piggybacked)."""
        lac = self._tracker.lac if self._frozen_lac is None else self._frozen_lac
        explicit = self._explicit
        if explicit is not None and lac > explicit.sent:
            explicit.sent = lac  # the bookies learn this LAC with this add
        body = self._digest.encode(self.ledger_id, op.entry_id, lac, op.length, op.payload)
        self._batcher.send(op, body, slots, self.ensemble, len(self._tracker.pending) == 1)

    async def sent(self, bookie: str) -> None:
        """Wait until every add so far has been handed to ``bookie``'s connection (or failed to
        connect): a FORCE sent after this cannot overtake them."""
        await self._batcher.sent(bookie)

    # ------------------------------------------------------------------ responses

    def _answered(self, op: PendingAdd) -> None:
        """One send of ``op`` is over (answered, failed or never sent)."""
        op.inflight -= 1
        if op.done and not op.inflight and op.charged:
            op.charged = False
            if self._budget is not None:
                self._budget.release(1, len(op.payload))

    def _on_response(
        self, op: PendingAdd, slot: int, bookie: str, result: Response | BKError
    ) -> None:
        self._answered(op)
        if self.error is not None:
            return
        if self.ensemble[slot] != bookie or self._failed.get(slot) == bookie:
            return  # from a bookie replaced (or being replaced) in this slot: does not count
        if isinstance(result, AddResponse) and result.status is StatusCode.EOK:
            tracker = self._tracker
            if self.volatile:
                tracker.synced_to(slot, result.last_add_synced)
            if tracker.ack(op, slot):
                self._complete_ready()
            return
        if isinstance(result, Response):
            if result.status is StatusCode.EFENCED:
                self.fail(LedgerFencedError(f"ledger {self.ledger_id} is fenced (bookie {bookie})"))
                return
            if result.status is StatusCode.EUA:
                self.fail(UnauthorizedError(f"bookie {bookie} refused the ledger's password"))
                return
            if result.status is StatusCode.ENOLEDGER:
                self.fail(
                    NoSuchLedgerError(
                        f"bookie {bookie} no longer has ledger {self.ledger_id}: it was deleted "
                        "and garbage-collected"
                    )
                )
                return
            log.warning(
                "ledger %d: bookie %s answered %s", self.ledger_id, bookie, result.status.name
            )
        else:
            log.warning("ledger %d: add to bookie %s failed: %s", self.ledger_id, bookie, result)
            if isinstance(result, OperationTimeoutError):
                self._pool.mark_failed(bookie)
        if self.volatile:
            self.fail(
                BookieUnavailableError(
                    f"bookie {bookie} failed an add to volatile ledger {self.ledger_id}; volatile "
                    "ledgers do not change their ensemble (BP-14): close or recover the ledger"
                )
            )
            return
        # Even when this entry already has its ack quorum: the bookie is failing, so the next
        # entries must go to a replacement (BookKeeper's handleBookieFailure).
        self._change.slot_failed(slot, bookie)

    def _on_batch(
        self, ops: list[PendingAdd], slot: int, bookie: str, result: Response | BKError
    ) -> None:
        """The answer to an ADD_BATCH: every entry acknowledged (the common case, done here),
        or each entry's answer taken as its own ADD's would have been."""
        if (
            isinstance(result, AddBatchResponse)
            and result.status is StatusCode.EOK
            and not result.statuses
            and self.error is None
            and self.ensemble[slot] == bookie
            and self._failed.get(slot) != bookie
        ):
            tracker = self._tracker
            if self.volatile:
                tracker.synced_to(slot, result.last_add_synced)
            answered, ack = self._answered, tracker.ack
            ready = False
            for op in ops:
                answered(op)
                if ack(op, slot):
                    ready = True
            if ready:
                self._complete_ready()
            return
        if not isinstance(result, AddBatchResponse):
            for op in ops:  # a failure, or an answer of another kind: each entry's
                self._on_response(op, slot, bookie, result)
            return
        statuses = [result.status] * len(ops)
        if result.status is StatusCode.EOK:
            try:
                statuses = unpack_statuses(result.statuses, len(ops))
            except BatchError as exc:
                log.warning("ledger %d: bookie %s: %s", self.ledger_id, bookie, exc)
                statuses = [StatusCode.EIO] * len(ops)
        synced = result.last_add_synced
        for op, status in zip(ops, statuses, strict=True):
            answer = AddResponse.from_fields(
                result.txn_id, status, self.ledger_id, op.entry_id, synced
            )
            self._on_response(op, slot, bookie, answer)

    def _complete_ready(self) -> None:
        """Acknowledge, in order, every entry at the head that has its ack quorum."""
        if self._change.changing and self._config.switches.hold_acks_during_change:
            return  # hold acknowledgements until the new fragment is in the metadata
        finished = finished_bytes = 0
        stats = self._stats
        now = stats.clock() if stats is not None else 0.0
        for op in self._tracker.pop_ready():
            if op.charged and not op.inflight:  # else the last answer gives its share back
                op.charged = False
                finished += 1
                finished_bytes += len(op.payload)
            if stats is not None:
                stats.appends += 1
                stats.append_bytes += len(op.payload)
                stats.append_latency.record(now - op.started)
            if not op.future.done():
                op.future.set_result(op.entry_id)
        if finished and self._budget is not None:
            self._budget.release(finished, finished_bytes)
        self._wake()

    def _wake(self) -> None:
        if not self._tracker.pending:
            idle, self._idle = self._idle, []
            for waiter in idle:
                if not waiter.done():
                    waiter.set_result(None)
            if self._explicit is not None:
                self._explicit.arm(self._lac_due)

    def _lac_due(self) -> tuple[int, Sequence[str]] | None:
        """For ``ExplicitLac``: the LAC to announce while idle, if any."""
        if self.error is not None or self._tracker.pending:
            return None
        return self._tracker.lac, self.ensemble

    def fail(self, error: BKError) -> None:
        """Fail every pending and future add with ``error``."""
        if self.error is None:
            self.error = error
        pending = self._tracker.drain()
        if self._stats is not None:
            self._stats.append_failures += len(pending)
        self._change.queued = []
        finished = finished_bytes = 0
        for op in pending:
            if op.charged and not op.inflight:  # else the last answer gives its share back
                op.charged = False
                finished += 1
                finished_bytes += len(op.payload)
            if not op.future.done():
                op.future.set_exception(error)
                op.future.exception()  # a caller that went away must not leave it unretrieved
        if finished and self._budget is not None:
            self._budget.release(finished, finished_bytes)
        self._wake()

    async def settle(self) -> None:
        """Wait until no add is pending (each acknowledged or failed)."""
        if self._tracker.pending:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._idle.append(waiter)
            await waiter

    async def close(self) -> None:
        if self._explicit is not None:
            await self._explicit.close()
        await self._batcher.withdraw()
        await self._tasks.cancel_and_wait(BKError)
