"""Every change to what a bookie knows of a ledger, in one place: journal it and apply it.

Theory of operation (in the manner of h11's ``_state.py``). A bookie's knowledge of one ledger
(``bookie.ledger_state.LedgerState``) moves through a handful of transitions:

- **create**: the first add, fencing read or recovery add naming an unknown ledger brings its
  master key (``ensure``) -- once ``bookie.key_check`` has admitted it against the ledger's
  metadata; BP-46 boot phase one creates the ledgers it must fence with the key unknown
  (``create_keyless``), and the first admitted request carrying a key teaches it;
- **fence** (BookKeeper's "Fencing" page, "Fencing internals"): from then on normal adds are
  refused;
- **limbo** on and off (BP-46): a missing entry is EUNKNOWN, not an explicit negative;
- **explicit LAC** (``write_lac``): raises the LAC without an add;
- **add** and **copy** (an entry stored; copy is the boot repair's, BP-46 phase two). An entry
  held is never replaced: ``bookie.ops.add`` answers an add of one itself, and ``copy`` leaves
  one that arrived while the repairer fetched it.

Each transition is one method of ``Ledgers`` that changes the state *and* appends the journal
record that makes it survive a crash, so the two cannot drift apart; ``apply(record)``, used by
replay at boot, sits beside them and is their inverse: for every record a transition writes,
``apply`` brings a freshly loaded state to where the transition left it. ``meta_dirty`` (the
ledger's fields must go into the next index segment) is set here and nowhere else, apart from
``LedgerState.advance_lac``.

Durability is the caller's to wait for: transitions take the journal callback (or return the
fence's future), so a handler answers only after the fdatasync that covers its record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiobk.bookie.journal.format import (
    ADD_PREFIX,
    LEDGER_PREFIX,
    LEDGER_VALUE,
    JournalCorruptError,
    Record,
    RecordType,
    add_payload,
)
from aiobk.bookie.journal.journal import Callback, Journal
from aiobk.bookie.ledger_state import MAX_KEY_SIZE, LedgerState
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.protocol import MAX_ENTRY_ID, MalformedEntryError, StatusCode, peek_header

log = logging.getLogger(__name__)


def _ignore(error: BaseException | None) -> None:
    """For records whose durability is awaited through a barrier that follows them."""


class Ledgers:
    """The owner of every ledger's state on one bookie (see the module docstring)."""

    def __init__(
        self,
        storage: LedgerStorage,
        journal: Journal,
        stats: BookieStats,
        *,
        journal_adds: bool = True,
    ) -> None:
        self.storage = storage
        self.journal = journal
        self.stats = stats
        self.journal_adds = journal_adds  # false: BP-46's journal-less adds
        self.owner = ""  # the bookie id, for log lines (known once the bookie has bound)

    def get(self, ledger_id: int) -> LedgerState | None:
        return self.storage.get(ledger_id)

    def in_use(self, ledger_id: int) -> LedgerState | None:
        """The ledger's state if it is in memory (no index lookup); else None."""
        return self.storage.in_use(ledger_id)

    # ------------------------------------------------------------------ create

    def ensure(self, ledger_id: int, master_key: bytes) -> tuple[LedgerState | None, StatusCode]:
        """The ledger's state, created (its key journaled) if new; EUA on a key mismatch,
        ENOLEDGER for a ledger garbage collection dropped, EBADREQ for a new ledger without a
        key. A request reaches this for a ledger not held (or held without its key) only once
        ``KeyCheck.admit`` has admitted its key: that is the handlers' to do."""
        storage = self.storage
        state = storage.get(ledger_id)
        if state is None:
            if storage.is_deleted(ledger_id):
                return None, StatusCode.ENOLEDGER  # garbage collected: it must not come back
            if not master_key:
                return None, StatusCode.EBADREQ
            state = storage.create(ledger_id, master_key)
            self._journal_key(state)
            return state, StatusCode.EOK
        if not state.master_key and master_key:
            # Created at boot (BP-46 phase one) with its key unknown: the first writer or
            # recovery that fences or writes it brings the key. The index must learn it too:
            # a fence of a ledger boot already fenced changes nothing else, and without this the
            # next checkpoint would trim the key's record while the index still held no key.
            state.master_key = master_key
            state.meta_dirty = True
            self._journal_key(state)
            return state, StatusCode.EOK
        if state.master_key != master_key:
            self.stats.auth_failures += 1
            return None, StatusCode.EUA
        return state, StatusCode.EOK

    def _journal_key(self, state: LedgerState) -> None:
        state.key_pending = True

        def durable(error: BaseException | None) -> None:
            if error is None:
                state.key_pending = False

        self.journal.append(
            RecordType.MASTER_KEY, LEDGER_PREFIX.pack(state.ledger_id) + state.master_key, durable
        )

    def create_keyless(self, ledger_id: int) -> LedgerState:
        """BP-46 phase one: a ledger this bookie must fence but never saw (or lost)."""
        state = self.storage.create(ledger_id, b"")
        self.journal.append(RecordType.MASTER_KEY, LEDGER_PREFIX.pack(ledger_id), _ignore)
        return state

    # ------------------------------------------------------------------ fence

    def start_fence(self, state: LedgerState) -> asyncio.Future[BaseException | None] | None:
        """Fence now; the future (None once durable) resolves with the journal's error, if any.
        Concurrent fences of one ledger share one record. A fence whose record failed (the
        journal stopped, see ``bookie.journal``) is journaled again by the next fence, so a
        bookie whose journal recovered can be fenced for good."""
        failed = state.fence_pending
        if not state.fenced or (
            failed is not None and failed.done() and failed.result() is not None
        ):
            state.fenced = True
            state.meta_dirty = True
            self.stats.fences += 1
            pending: asyncio.Future[BaseException | None] = (
                asyncio.get_running_loop().create_future()
            )
            state.fence_pending = pending

            def done(error: BaseException | None) -> None:
                # A fence that never became durable stays pending with its error: a later
                # fence must not be told "fenced" because the flag is set in memory (I11; found
                # by the simulator, seed 398: a full disk failed the journal under a fence).
                if error is None and state.fence_pending is pending:
                    state.fence_pending = None
                if not pending.done():
                    pending.set_result(error)

            self.journal.append(RecordType.FENCE, LEDGER_PREFIX.pack(state.ledger_id), done)
        return state.fence_pending

    async def fence(self, state: LedgerState) -> BaseException | None:
        """Fence durably: None once the fence is synced, else the journal's error."""
        pending = self.start_fence(state)
        if pending is None:
            return None
        return await asyncio.shield(pending)

    # ------------------------------------------------------------------ limbo, LAC

    def set_limbo(self, state: LedgerState, limbo: bool, callback: Callback = _ignore) -> None:
        state.limbo = limbo
        state.meta_dirty = True
        self.journal.append(
            RecordType.LIMBO, LEDGER_VALUE.pack(state.ledger_id, int(limbo)), callback
        )

    def write_lac(self, state: LedgerState, lac: int, callback: Callback) -> None:
        """An explicit LAC (BookKeeper's ExplicitLac): raised at once, only upward."""
        state.advance_lac(lac)
        self.journal.append(
            RecordType.EXPLICIT_LAC, LEDGER_VALUE.pack(state.ledger_id, lac), callback
        )

    # ------------------------------------------------------------------ entries

    def add(
        self,
        state: LedgerState,
        entry_id: int,
        body: bytes,
        piggybacked_lac: int,
        done: Callback,
        on_written: Callback | None = None,
    ) -> None:
        """Store an entry (reads see it at once) and journal it; ``done`` runs once it is
        durable, ``on_written`` (BP-14 volatile adds) once written. Journal-less (BP-46), the
        add is in ledger storage only and ``done`` runs at once -- or once the ledger's new
        master key is synced, which must be durable before any ack."""
        self.add_batch(state, ((entry_id, body),), piggybacked_lac, done, on_written)

    def add_batch(
        self,
        state: LedgerState,
        entries: Sequence[tuple[int, bytes]],
        lac: int,
        done: Callback,
        on_written: Callback | None = None,
    ) -> None:
        """``add`` of each (entry id, body) of one ledger -- an ADD_BATCH's, ids increasing and
        each new here -- with one ``done`` (and ``on_written``) for them all; ``lac``: the
        highest LAC they piggyback (raising a LAC by each in turn ends where raising it by the
        highest does). Their ADD records are journaled together (``Journal.append_adds``)."""
        self.storage.add_entries(state, entries)
        state.advance_lac(lac)
        cursor = state.sync
        cursor.confirmed(lac)  # BP-14: a LAC is confirmed on an ack quorum
        if not self.journal_adds:
            if state.key_pending:
                self.journal.barrier(done)
            else:
                done(None)
            return

        def synced(error: BaseException | None) -> None:
            if error is None:
                mark = cursor.synced
                for entry_id, _body in entries:
                    mark(entry_id)
            done(error)

        self.journal.append_adds(state.ledger_id, entries, synced, on_written)

    def copy(self, state: LedgerState, entry_id: int, body: bytes) -> None:
        """An entry copied back from a peer (BP-46 phase two; the repairer verified it);
        durable at the next barrier. Its piggybacked LAC counts, as when replay reads it.
        The repairer held ``state`` across its fetch: if the ledger's state was dropped and
        loaded again meanwhile, the current one takes the copy (none: deleted meanwhile)."""
        current = self.get(state.ledger_id)
        if current is None or current.location(entry_id) >= 0:
            return  # deleted meanwhile, or the entry arrived meanwhile: never replaced
        state = current
        self.storage.add_entry(state, entry_id, body)
        state.advance_lac(peek_header(body)[2])
        self.journal.append(RecordType.ADD, add_payload(state.ledger_id, entry_id, body), _ignore)

    async def durable(self) -> None:
        """Until every record so far is synced. The waiter may be cancelled (a stopping
        bookie cancels its repair), so the barrier resolves it only if still pending."""
        done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

        def resolve(error: BaseException | None) -> None:
            if not done.done():
                done.set_result(error)

        self.journal.barrier(resolve)
        error = await done
        if error is not None:
            raise error

    # ------------------------------------------------------------------ replay

    def apply(self, record: Record) -> None:
        """Re-apply one journal record at boot, as the transition that wrote it left things.

        Every record here was acknowledged or at least journaled, so none may stop the boot:
        a value storage cannot hold (written by a version that did not check requests at the
        door, ``protocol.limits``) is logged, counted and left out rather than refused."""
        payload = record.payload
        storage = self.storage
        if record.kind is RecordType.MASTER_KEY:
            (ledger_id,) = LEDGER_PREFIX.unpack_from(payload)
            key = payload[LEDGER_PREFIX.size :]
            if len(key) > MAX_KEY_SIZE:
                self._skip(record, f"ledger {ledger_id}: a {len(key)}-byte master key")
                key = b""  # kept as a ledger whose key is unknown, like a limbo one
            state = storage.get(ledger_id)
            if state is None:
                if not storage.is_deleted(ledger_id):
                    storage.create(ledger_id, key)
            elif not state.master_key and key:
                state.master_key = key  # a ledger created at boot learns its key
                state.meta_dirty = True
            return
        ledger_id = LEDGER_PREFIX.unpack_from(payload)[0]
        state = storage.get(ledger_id)
        if state is None:
            if storage.is_deleted(ledger_id):
                return  # garbage collected after this record was written
            raise JournalCorruptError(
                f"journal record {record.lsn} names ledger {ledger_id} before its master key"
            )
        if record.kind is RecordType.ADD:
            _ledger, entry_id = ADD_PREFIX.unpack_from(payload)
            body = payload[ADD_PREFIX.size :]
            try:
                lac = peek_header(body)[2]
            except MalformedEntryError as exc:
                self._skip(record, f"entry {ledger_id}/{entry_id}: {exc}")
                return
            if not 0 <= entry_id <= MAX_ENTRY_ID:
                self._skip(record, f"entry id {entry_id} of ledger {ledger_id}")
                return
            storage.add_entry(state, entry_id, body)
            state.advance_lac(lac)
            state.sync.synced(entry_id)  # replayed: made durable by the checkpoint after boot
        elif record.kind is RecordType.FENCE:
            state.fenced = True
            state.meta_dirty = True
        elif record.kind is RecordType.EXPLICIT_LAC:
            state.advance_lac(LEDGER_VALUE.unpack_from(payload)[1])
        elif record.kind is RecordType.LIMBO:
            state.limbo = bool(LEDGER_VALUE.unpack_from(payload)[1])
            state.meta_dirty = True

    def _skip(self, record: Record, what: str) -> None:
        self.stats.journal_records_skipped += 1
        log.error(
            "bookie %s: journal record %d holds %s that ledger storage cannot keep; left out",
            self.owner,
            record.lsn,
            what,
        )


__all__ = ["Ledgers"]
