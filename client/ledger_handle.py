"""A ledger open for writing (``BookKeeper.create_ledger``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiobk.client.add import AddMode, AddPipeline
from aiobk.client.add_batches import PendingAdd
from aiobk.client.backpressure import acquire
from aiobk.client.close import close_as_writer
from aiobk.client.connection import status_error
from aiobk.client.context import ClientContext
from aiobk.client.digest import Digester
from aiobk.client.ensemble_change import ReplacementsChosen, change_ensemble
from aiobk.client.recovery import LedgerRecovery
from aiobk.metadata import LedgerMetadata
from aiobk.protocol import Durability, ForceRequest, ForceResponse, StatusCode
from aiobk.protocol.errors import BKError, LedgerClosedError, LedgerFencedError

log = logging.getLogger(__name__)


class LedgerHandle:
    """A ledger open for writing, from ``BookKeeper.create_ledger``: one writer appends
    entries with dense ids from 0, many in flight at once, and closes it.

    ``async with`` closes it on exit (also when the block raises: then at what was confirmed,
    and the block's exception propagates).

    Attributes:
        ledger_id: The ledger's id.
        metadata: Its metadata as this writer last wrote or read it (ensembles, quorums).
    """

    def __init__(
        self,
        ctx: ClientContext,
        *,
        ledger_id: int,
        metadata: LedgerMetadata,
        master_key: bytes,
        digest: Digester,
    ) -> None:
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._ctx = ctx
        self.store = ctx.store
        self.pool = ctx.pool
        self.config = ctx.config
        self.bad_bookies: set[str] = set()
        self.fenced = False
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        self._master_key = master_key
        self._digest = digest
        # The client's budget of unfinished adds, shared by all its handles (backpressure.py).
        self._budget = ctx.budget
        self._pipeline = AddPipeline(
            ctx,
            ledger_id=ledger_id,
            master_key=master_key,
            digest=digest,
            metadata=metadata,
            change_ensemble=self._change_ensemble,
            mode=AddMode.writer(metadata.durability),
        )

    async def _change_ensemble(
        self,
        first_entry: int,
        ensemble: list[str],
        failed: dict[int, str],
        chosen: ReplacementsChosen | None,
    ) -> list[str]:
        self.bad_bookies.update(failed.values())
        try:
            new, self.metadata = await change_ensemble(
                self._ctx,
                self.ledger_id,
                lambda: self.metadata,
                first_entry,
                ensemble,
                failed,
                self.bad_bookies,
                chosen,
            )
        except LedgerFencedError:
            self.fenced = True  # a recovery started: this writer stops for good
            raise
        return new

    # ------------------------------------------------------------------ state

    @property
    def last_add_confirmed(self) -> int:
        """The last add confirmed (LAC): every entry up to it is acknowledged (and, for a
        volatile ledger, synced); readers may read up to it. -1 before the first."""
        return self._pipeline.lac

    @property
    def last_add_pushed(self) -> int:
        """The id of the last entry handed out by ``append``/``submit``, confirmed or not."""
        return self._pipeline.next_entry_id - 1

    @property
    def length(self) -> int:
        """Payload bytes of the entries up to the last add confirmed."""
        return self._pipeline.lac_length

    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` ran (successfully or not): no more appends."""
        return self._closed

    @property
    def durability(self) -> Durability:
        """The ledger's durability mode, fixed at creation."""
        return self.metadata.durability

    # ------------------------------------------------------------------ writing

    async def append(self, data: bytes) -> int:
        """Add ``data`` as the next entry, and wait until it is confirmed.

        The entry id is assigned at the call, in call order; the append resolves once the
        entry and every lower one are on an ack quorum of bookies (``PERSISTENT``: fsynced;
        ``VOLATILE``: written). Many appends may be in flight at once: that is how throughput
        is had. Beyond the client's budget of unfinished appends the call waits for room.
        Cancelling the call cancels only the wait: the add itself carries on.

        Args:
            data: The entry's payload.

        Returns:
            The entry id.

        Raises:
            LedgerClosedError: The handle is closed.
            LedgerFencedError: Another client recovered the ledger; this writer is done.
            EntryTooLargeError: ``data`` cannot fit one add request.
            NotEnoughBookiesError: A bookie failed and none could replace it.
            BKError: The ledger failed earlier (the same error again).
        """
        payload, op = self._start_now(data)
        if op is None:
            op = await self._queued(payload)
        # No shield needed: a caller that is cancelled cancels only its wait; the pipeline never
        # sets a result on a future that is done, and the add itself carries on.
        return await op.future

    async def submit(self, data: bytes) -> tuple[int, asyncio.Future[int]]:
        """Start adding ``data``: its entry id now, and a future that resolves as ``append``
        would return.

        For callers that must know which entry an add that later fails was (the log writer
        resolves such an add against the recovered end of the ledger).

        Args:
            data: The entry's payload.

        Returns:
            The entry id, and a future of it that raises what ``append`` would raise.

        Raises:
            LedgerClosedError: The handle is closed.
            EntryTooLargeError: ``data`` cannot fit one add request.
        """
        payload, op = self._start_now(data)
        if op is None:
            op = await self._queued(payload)
        return op.entry_id, op.future

    def try_submit(self, data: bytes) -> tuple[int, asyncio.Future[int]] | None:
        """``submit`` without waiting for room in the client's budget of unfinished adds.

        Args:
            data: The entry's payload.

        Returns:
            As ``submit``; or None, with nothing started, when the budget has no room now
            (``submit`` then waits for it, in turn).

        Raises:
            LedgerClosedError: The handle is closed (and as ``append`` does when the ledger
                cannot take the entry).
        """
        _payload, op = self._start_now(data)
        return None if op is None else (op.entry_id, op.future)

    def check_size(self, data: bytes) -> None:
        """``EntryTooLargeError`` unless ``data`` fits in one add request of this ledger."""
        self._pipeline.check_size(data)

    def _start_now(self, data: bytes) -> tuple[bytes, PendingAdd | None]:
        """The payload of an append this handle may start (else the error it fails with), and
        its add if the budget has room at once -- no wait, and no coroutine for one."""
        if self._is_closing():
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        pipeline = self._pipeline
        if pipeline.error is not None:
            raise pipeline.error
        payload = bytes(data)
        pipeline.check_size(payload)  # never queue for what can never be sent
        if self._budget.admit(len(payload)):
            return payload, pipeline.add(payload)  # gives the grant back itself if it raises
        return payload, None

    async def _queued(self, payload: bytes) -> PendingAdd:
        """Backpressure (client-wide, FIFO): wait for one add and len(payload) bytes of the
        budget; from here the grant belongs to the add and comes back when it finishes."""
        await acquire(self._budget, len(payload))
        if self._is_closing():  # closed while this append waited
            self._budget.release(1, len(payload))
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        return self._pipeline.add(payload)

    def _is_closing(self) -> bool:
        return self._closed or self._closing is not None

    async def force(self) -> int:
        """Make the appended entries durable and move the LAC over them.

        ``VOLATILE`` (BP-14's sync API): every bookie of the ensemble syncs what it holds and
        reports its LastAddSynced; the LAC moves by BP-14's rule, but only up to the entries
        acknowledged before this call began. The bookies that answered move the LAC even when
        another did not. ``PERSISTENT`` ledgers sync every add before acknowledging it, so
        this only waits for the outstanding adds.

        Returns:
            The new last add confirmed.

        Raises:
            BookieUnavailableError: A bookie of the ensemble could not be reached (also
                ``OperationTimeoutError`` and other bookie errors).
            BKError: The ledger failed earlier.
        """
        pipeline = self._pipeline
        if pipeline.error is not None:
            raise pipeline.error
        if not pipeline.volatile:
            await pipeline.settle()
            if pipeline.error is not None:
                raise pipeline.error
            return pipeline.lac
        ceiling = pipeline.last_acked
        replies = await asyncio.gather(
            *(self._force_one(bookie) for bookie in pipeline.ensemble), return_exceptions=True
        )
        # The bookies that answered count even if one did not: a slot that failed keeps the
        # LastAddSynced it had, which can only hold the LAC lower (BP-14's rule takes the
        # AQ-th highest value). close() relies on this when a bookie is gone.
        for slot, synced in enumerate(replies):
            if isinstance(synced, int):
                pipeline.synced[slot] = max(pipeline.synced[slot], synced)
        lac = pipeline.advance_volatile_lac(ceiling)
        for failure in replies:
            if isinstance(failure, BaseException):
                raise failure
        return lac

    async def _force_one(self, bookie: str) -> int:
        await self._pipeline.sent(bookie)  # the FORCE must not overtake the adds it covers
        conn = await self.pool.get(bookie)
        request = ForceRequest(conn.next_txn_id(), self.ledger_id, self._master_key)
        response = await conn.send(request, self.config.add_timeout)
        if response.status is not StatusCode.EOK:
            raise status_error(response, bookie)
        assert isinstance(response, ForceResponse)
        return response.last_add_synced

    async def close(self) -> None:
        """Wait for the outstanding adds, then close the ledger at the last confirmed entry.

        A volatile ledger is forced first; when the force cannot cover every acknowledged
        entry, the ledger is recovered instead (fenced, every copy read, missing copies
        written back) and closed at the end the copies show, so no acknowledged entry that
        still has a copy is cut off. Idempotent; concurrent calls share one close, and a close
        that failed fails again.

        Raises:
            LedgerFencedError: Another client recovered the ledger first.
            LedgerRecoveryError: A volatile ledger could not be sealed (too few bookies);
                it is left open for a later recovery.
            MetadataStoreError: The close could not reach the metadata store in time.
        """
        closing = self._closing
        if closing is not None and closing.done():
            closing.result()  # raises what the first close raised
            return
        if self._closed:
            return
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_future()
            try:
                await self._pipeline.settle()
                pipeline = self._pipeline
                recovered = await self._seal_volatile() if pipeline.volatile else None
                if recovered is not None:
                    self.metadata = recovered
                    self._closed = True
                elif not self.fenced:
                    self.metadata = await close_as_writer(
                        self._ctx, self.ledger_id, self.metadata, pipeline.lac, pipeline.lac_length
                    )
                    self._closed = True
                else:
                    self._closed = True
                    raise pipeline.error or LedgerClosedError(f"ledger {self.ledger_id} fenced")
                self._closing.set_result(None)
            except BaseException as exc:
                self._closed = True
                self._closing.set_exception(exc)
                self._closing.exception()
                raise
            finally:
                await self._pipeline.close()
                if self._pipeline.error is None:
                    self._pipeline.fail(LedgerClosedError(f"ledger {self.ledger_id} is closed"))
        else:
            await asyncio.shield(self._closing)

    async def __aenter__(self) -> LedgerHandle:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        """Close the ledger. Leaving on an exception, the ledger is still closed (at what was
        confirmed) and that exception is what propagates: a close that fails too is logged."""
        if exc is None:
            await self.close()
            return
        try:
            await self.close()
        except BKError as close_error:
            if close_error is not exc:  # often the same failure, raised by both
                log.warning("ledger %d: close on leaving with %r failed: %s",
                            self.ledger_id, exc, close_error)  # fmt: skip

    async def _seal_volatile(self) -> LedgerMetadata | None:
        """Close-to-open (BP-14 "a failure at any point treats the entire ledger write
        failure"): make every acknowledged entry durable before the close. When some bookie
        cannot sync (or the ledger already failed), closing at the LAC would drop entries that
        were acknowledged; recover instead, as a reader would -- fence, read every copy, write
        the missing ones back synced, close at the end the copies show -- and return that
        metadata. Raises if even recovery cannot reach enough bookies."""
        pipeline = self._pipeline
        if pipeline.error is None:
            with contextlib.suppress(BKError):
                await self.force()
        if self.fenced or pipeline.lac >= pipeline.last_acked:
            return None
        return await LedgerRecovery(
            self._ctx, ledger_id=self.ledger_id, master_key=self._master_key, digest=self._digest
        ).run(self.metadata)

    def __repr__(self) -> str:
        return (
            f"LedgerHandle({self.ledger_id}, lac={self.last_add_confirmed}, "
            f"pushed={self.last_add_pushed}, {self.metadata!r})"
        )

    @property
    def error(self) -> BKError | None:
        """What failed the ledger for this writer (every later append raises it), or None."""
        return self._pipeline.error
