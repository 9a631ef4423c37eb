"""A writer's ensemble change ("The BookKeeper protocol", "Writing to ledgers", last bullets).

Replacements come from the registry's writable bookies, excluding the current ensemble and every
bookie known to have failed. The new fragment starts at LAC + 1 and reaches the metadata by
compare-and-set. On a lost race the metadata is read again: a ledger no longer OPEN means a
recovery started, so the writer stops for good (``LedgerFencedError``) and never writes the
metadata again; an OPEN ledger changed by someone else gets the fragment added to its newer
version.

An unreachable metadata store (etcd restarting) is retried with backoff for
``metadata_retry_timeout`` (metadata_retry.py) before the change fails, and with it the ledger.

``EnsembleChange`` is the add pipeline's side of it (add.py's theory, "A bookie that fails an
add"): which slots are being replaced, the rounds of changes until none is left, and the
entries sent again to the replacements or held until the change is done. It lives here, beside
the metadata side, so that the pipeline hands failures over and never sees the rounds.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from aiobk.client.ack_tracker import AckTracker
from aiobk.client.add_batches import PendingAdd
from aiobk.client.config import ClientConfig
from aiobk.client.context import ClientContext
from aiobk.client.metadata_retry import MetadataRetry
from aiobk.metadata import LedgerMetadata, LedgerState
from aiobk.protocol.errors import BKError, LedgerFencedError, MetadataVersionError

log = logging.getLogger(__name__)

# Called with the new ensemble once the replacements are chosen, before the change is durable.
ReplacementsChosen = Callable[[list[str]], None]
# (first entry of the new fragment, current ensemble, failed slot -> bookie, chosen) -> new ensemble
EnsembleChanger = Callable[
    [int, list[str], dict[int, str], ReplacementsChosen | None], Awaitable[list[str]]
]


async def change_ensemble(
    ctx: ClientContext,
    ledger_id: int,
    current: Callable[[], LedgerMetadata],
    first_entry: int,
    ensemble: list[str],
    failed: dict[int, str],
    bad: set[str],
    chosen: ReplacementsChosen | None = None,
) -> tuple[list[str], LedgerMetadata]:
    """Replace the ``failed`` slots of ``ensemble`` in a new fragment from ``first_entry``;
    return the new ensemble and the metadata written. ``current()`` is the writer's latest
    metadata, read when the CAS is attempted (a close may not race past it); ``bad`` are the
    bookies never to choose."""
    store, config = ctx.store, ctx.config
    # The listing, the CAS and the re-reads ride out an unreachable store together, for
    # metadata_retry_timeout; acknowledgements stay held meanwhile (the pipeline is changing).
    retry = MetadataRetry(config, f"ledger {ledger_id}: ensemble change")
    candidates = await retry.call(
        "listing the writable bookies", functools.partial(ctx.pool.writable_bookies, fresh=True)
    )
    new = list(ensemble)
    for slot in sorted(failed):
        new[slot] = ctx.replacement(
            candidates, new, bad, slot, current().write_quorum, f"ledger {ledger_id}"
        )
    if chosen is not None:  # ProtocolSwitches.replace_after_cas off: write before the CAS
        chosen(list(new))
    metadata = current()
    retries = config.metadata_retries
    for _attempt in range(retries):
        wanted = metadata.with_fragment(first_entry, tuple(new))
        try:
            written = await retry.call(
                "writing the new fragment", functools.partial(store.write_ledger, ledger_id, wanted)
            )
            ctx.stats.ensemble_changes += 1
            return new, written
        except MetadataVersionError:
            latest = await retry.call(
                "reading the metadata again", functools.partial(store.read_ledger, ledger_id)
            )
            if latest.state is not LedgerState.OPEN:
                raise LedgerFencedError(
                    f"ledger {ledger_id} is {latest.state.value}: another client is "
                    "recovering or closed it"
                ) from None
            metadata = latest
    raise MetadataVersionError(
        f"ledger {ledger_id}: ensemble change still racing after {retries} attempts"
    )


class Writer(Protocol):
    """What an ``EnsembleChange`` reads and writes of its pipeline: the ensemble whose slots it
    replaces, and the error that stops it (``fail`` sets it)."""

    ensemble: list[str]
    error: BKError | None

    def fail(self, error: BKError) -> None: ...


class EnsembleChange:
    """One pipeline's failed slots and the rounds of changes that replace them.

    ``changing`` is true from the first failure until no failed slot is left (or the pipeline
    failed); failures that arrive before a round starts merge into it, later ones make another
    round. Meanwhile new adds wait in ``queued`` (unless ``sent_early``: with
    ``replace_after_cas`` off a round writes to the replacements before its CAS lands), and
    ``send``, ``complete_ready`` and ``spawn`` are the pipeline's."""

    def __init__(
        self,
        writer: Writer,
        tracker: AckTracker[PendingAdd],
        write_sets: list[tuple[int, ...]],
        config: ClientConfig,
        change_ensemble: EnsembleChanger,
        *,
        ledger_id: int,
        send: Callable[[PendingAdd, Sequence[int]], None],
        complete_ready: Callable[[], None],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self._writer = writer
        self._tracker = tracker
        self._write_sets = write_sets
        self._e = len(write_sets)
        self._config = config
        self._change_ensemble = change_ensemble
        self._ledger_id = ledger_id
        self._send = send
        self._complete_ready = complete_ready
        self._spawn = spawn
        self.failed: dict[int, str] = {}  # slot -> the bookie being replaced in it
        self.changing = False
        self.sent_early = False  # replace_after_cas off: this change already sends to the new
        self.queued: list[PendingAdd] = []  # adds waiting for the change before their first send

    def slot_failed(self, slot: int, bookie: str) -> None:
        if self._writer.ensemble[slot] != bookie or slot in self.failed:
            return
        self.failed[slot] = bookie
        if not self.changing:
            self.changing = True
            self._spawn(self._run())

    async def _run(self) -> None:
        writer = self._writer
        try:
            while self.failed and writer.error is None:
                failed = dict(self.failed)
                first_entry = self._tracker.lac + 1  # acks are held: the LAC cannot move
                self._tracker.forget_slots(list(failed))  # their acks above the LAC: void
                chosen = None
                if not self._config.switches.replace_after_cas:
                    chosen = functools.partial(self._send_early, failed)
                new_ensemble = await self._change_ensemble(
                    first_entry, list(writer.ensemble), failed, chosen
                )
                writer.ensemble = list(new_ensemble)
                for slot, bookie in failed.items():
                    if self.failed.get(slot) == bookie:
                        del self.failed[slot]
                if not self.sent_early:
                    self._resend(failed)
                self.sent_early = False
        except BKError as exc:
            writer.fail(exc)
        except Exception as exc:  # pragma: no cover - a bug must not leave adds hanging
            log.exception("ledger %d: ensemble change crashed", self._ledger_id)
            writer.fail(BKError(f"ensemble change failed: {exc!r}"))
        finally:
            self.changing = False
            self.sent_early = False
        if writer.error is None:
            self._send_queued()
            self._complete_ready()

    def _resend(self, failed: dict[int, str]) -> None:
        """Every unacknowledged entry of the replaced slots goes to the replacements."""
        for op in list(self._tracker.pending):
            if op.queued:
                continue
            slots = [s for s in self._write_sets[op.entry_id % self._e] if s in failed]
            if slots:
                self._send(op, slots)

    def _send_early(self, failed: dict[int, str], new_ensemble: list[str]) -> None:
        """``replace_after_cas`` off: write to the replacements before the CAS lands."""
        if self._writer.error is not None:
            return
        self._writer.ensemble = list(new_ensemble)
        self.sent_early = True
        self._resend(failed)
        self._send_queued()

    def _send_queued(self) -> None:
        """First sends of the adds that waited for the change, to the current ensemble."""
        queued, self.queued = self.queued, []
        for op in queued:
            op.queued = False
            if not op.done:
                self._send(op, self._write_sets[op.entry_id % self._e])
