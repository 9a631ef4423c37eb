"""The adds' way to the bookies: each add framed once, the adds of one loop turn to one bookie
gathered into one ADD_BATCH (protocol 2), and handed to the bookie's connection in order.

The pipeline (add.py) decides what goes where and reacts to the answers; this module owns the
frames, the adds waiting for the end of the loop turn and their delivery, so the batching rules
(a lone add leaves at once, how large a batch grows, what a protocol-1 bookie gets) live in one
place. ``PendingAdd``, the add in flight both sides work on, lives here so that the pipeline
imports this module and never the other way round.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

from aiobk.client.connection import BookieConnection
from aiobk.client.pool import BookiePool, Sender
from aiobk.protocol import (
    AddBatchRequest,
    AddFlag,
    AddRequest,
    Durability,
    Response,
    encode,
    encode_parts,
)
from aiobk.protocol.add_codecs import pack_bodies
from aiobk.protocol.errors import BKError

# The adds of one loop turn to one bookie leave in one ADD_BATCH (protocol 2) of at most this
# many entries and bytes of bodies; a bookie takes up to protocol.MAX_BATCH_ENTRIES.
BATCH_ENTRIES = 256
BATCH_BYTES = 1024 * 1024


class PendingAdd:
    __slots__ = (
        "acks", "body", "charged", "done", "entry_id", "frame", "future", "inflight", "length",
        "payload", "queued", "started", "unsent",
    )  # fmt: skip

    def __init__(
        self, entry_id: int, payload: bytes, length: int, future: asyncio.Future[int]
    ) -> None:
        self.entry_id = entry_id
        self.payload = payload
        self.length = length  # ledger length including this entry
        self.future = future
        self.acks = 0  # bitmask of slots that acknowledged
        self.done = False
        self.queued = False  # waiting for an ensemble change to finish before its first send
        self.charged = False  # holds a share of the client's AddBudget (add.py's theory)
        self.inflight = 0  # sends whose callback has not run yet
        self.started = 0.0  # when the add began (ClientStats.clock), for the append latency
        # Between a send and its batch's flush: the encoded entry, and how many bookies'
        # batches still hold it (the body is dropped when none does); the ADD frame, once made
        # for one bookie, is the same for the others.
        self.body = b""
        self.unsent = 0
        self.frame: tuple[int, bytes] | None = None


# The pipeline's handlers of one add's answer and of one ADD_BATCH's answer from (slot, bookie).
AddAnswer = Callable[[PendingAdd, int, str, Response | BKError], None]
BatchAnswer = Callable[[list[PendingAdd], int, str, Response | BKError], None]


class _Outgoing:
    """The adds waiting for the end of the loop turn to leave for one bookie of one slot."""

    __slots__ = ("ops", "size")

    def __init__(self) -> None:
        self.ops: list[PendingAdd] = []
        self.size = 0


class AddBatcher:
    """Frames and delivers one pipeline's adds: a lone add at once, the others at the end of
    the loop turn (one ``call_soon`` per turn) in one ADD_BATCH per bookie.

    Every send's answer goes to ``on_response`` (an ADD) or ``on_batch`` (an ADD_BATCH);
    ``answered`` is told of each send that never reached a bookie; ``failed()`` says the
    pipeline has failed, so nothing queued needs to leave."""

    def __init__(
        self,
        pool: BookiePool,
        timeout: float,
        ledger_id: int,
        master_key: bytes,
        flags: AddFlag,
        durability: Durability,
        *,
        on_response: AddAnswer,
        on_batch: BatchAnswer,
        answered: Callable[[PendingAdd], None],
        failed: Callable[[], bool],
    ) -> None:
        self.ledger_id = ledger_id
        self._key = master_key
        self._flags = flags
        self._durability = durability
        self._pool = pool  # its txn ids
        self._on_response = on_response
        self._on_batch = on_batch
        self._answered = answered
        self._failed = failed
        self._loop = asyncio.get_running_loop()
        self._sender: Sender[Sequence[PendingAdd]] = Sender(pool, timeout, self._answered_all)
        # (slot, bookie) -> the adds to send it at the end of this loop turn, in one ADD_BATCH
        self._outgoing: dict[tuple[int, str], _Outgoing] = {}
        self._flush_scheduled = False

    def send(
        self, op: PendingAdd, body: bytes, slots: Sequence[int], ensemble: list[str], alone: bool
    ) -> None:
        """Send ``op``, encoded as ``body``, to the bookies of ``slots`` in ``ensemble``: now
        when it is ``alone`` in flight (a lone add waits for nothing), else at the end of this
        loop turn, with the other adds to the same bookies, in one ADD_BATCH each: fewer
        frames, less codec work per add."""
        op.inflight += len(slots)  # each send's callback runs exactly once
        op.frame = None  # a resend carries the LAC as it is now
        if alone:
            txn_id, frame = self._frame(op, body)
            send = self._sender.send
            for slot in slots:
                bookie = ensemble[slot]
                send(bookie, txn_id, frame, self._callback(op, slot, bookie), (op,), True)
            op.frame = None
            return
        op.body = body
        op.unsent += len(slots)
        outgoing = self._outgoing
        size = len(body)
        for slot in slots:
            key = (slot, ensemble[slot])
            out = outgoing.get(key)
            if out is None:
                out = outgoing[key] = _Outgoing()
            elif len(out.ops) >= BATCH_ENTRIES or out.size + size > BATCH_BYTES:
                del outgoing[key]
                self._flush_one(key[0], key[1], out.ops)
                out = outgoing[key] = _Outgoing()
            out.ops.append(op)
            out.size += size
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_outgoing)

    def _frame(self, op: PendingAdd, body: bytes) -> tuple[int, bytes]:
        """One ADD of ``op``, made once for every bookie it goes to (a shared txn id)."""
        frame = op.frame
        if frame is None:
            txn_id = next(self._pool.txn_ids)
            request = AddRequest.from_fields(
                txn_id,
                self.ledger_id,
                op.entry_id,
                self._flags,
                self._durability,
                self._key,
                body,
            )
            frame = op.frame = (txn_id, encode(request))
        return frame

    def _callback(
        self, op: PendingAdd, slot: int, bookie: str
    ) -> Callable[[Response | BKError], None]:
        # A partial, not a lambda: one Python frame less per answer, on the hot path.
        return functools.partial(self._on_response, op, slot, bookie)

    def _flush_outgoing(self) -> None:
        self._flush_scheduled = False
        outgoing, self._outgoing = self._outgoing, {}
        for (slot, bookie), out in outgoing.items():
            self._flush_one(slot, bookie, out.ops)

    def _flush_one(self, slot: int, bookie: str, ops: list[PendingAdd]) -> None:
        """Hand the adds queued for ``bookie`` to its connection, now or once it is open."""
        if self._failed():  # failed meanwhile: nobody waits for these answers
            for op in ops:
                self._unqueued(op)
                self._answered(op)
            return
        self._sender.deliver(bookie, functools.partial(self._deliver, slot, bookie, ops), ops)

    def _deliver(
        self, slot: int, bookie: str, ops: list[PendingAdd], conn: BookieConnection | BKError
    ) -> None:
        """One ADD_BATCH when there are several adds and the connection speaks protocol 2,
        else one ADD each; or each add's failure, when the connection could not be made."""
        if isinstance(conn, BKError):
            for op in ops:
                self._unqueued(op)
            self._on_batch(ops, slot, bookie, conn)
            return
        timeout = self._sender.timeout
        if len(ops) == 1 or conn.protocol_version < 2:
            for op in ops:
                txn_id, frame = self._frame(op, op.body)
                self._unqueued(op)
                conn.send_frame(txn_id, frame, timeout, self._callback(op, slot, bookie))
            return
        txn_id = next(self._pool.txn_ids)
        request = AddBatchRequest.from_fields(
            txn_id,
            self.ledger_id,
            self._flags,
            self._durability,
            self._key,
            pack_bodies([op.body for op in ops]),
        )
        for op in ops:
            self._unqueued(op)
        callback = functools.partial(self._on_batch, ops, slot, bookie)
        head, bodies = encode_parts(request)  # the bodies go out as packed, not copied again
        conn.send_frame(txn_id, head, timeout, callback, tail=bodies)

    @staticmethod
    def _unqueued(op: PendingAdd) -> None:
        op.unsent -= 1
        if not op.unsent:
            op.body = b""
            op.frame = None

    def _answered_all(self, ops: Sequence[PendingAdd]) -> None:
        for op in ops:
            self._answered(op)

    async def sent(self, bookie: str) -> None:
        """Wait until every add so far has been handed to ``bookie``'s connection (or failed to
        connect): a FORCE sent after this cannot overtake them."""
        if self._outgoing:
            self._flush_outgoing()
        await self._sender.sent(bookie)

    async def withdraw(self) -> None:
        """The pipeline is closing: what has not left yet never will, and gets no answer."""
        outgoing, self._outgoing = self._outgoing, {}
        for out in outgoing.values():  # never sent: no answer will come
            for op in out.ops:
                self._unqueued(op)
                self._answered(op)
        await self._sender.withdraw()
