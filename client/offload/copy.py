"""Offloading one closed ledger: its entries copied into one object of the cluster's object
store, the copy checked, then recorded in the ledger's metadata (docs/design/tiered-storage.md).

The order of the steps is what makes a crash anywhere harmless:

1. The ledger's id joins the offload work list, so the repair pass finds the attempt whatever
   becomes of it.
2. The metadata names the attempt (state ``copying``, a fresh uid, the object's key) by
   compare-and-set *before any byte is written*: an object that no metadata names is garbage,
   always, and the sweep removes it without a grace period.
3. The entries stream from the bookies (digests checked) into the object, in runs of
   consecutive entries where the bookies read them so (``client.range_read``).
4. The object is read back whole and checked: every body against the CRC32C its index record
   holds, computed from the body as the bookies served it when the block was packed, and the
   index against the CRC the metadata will name.
5. The metadata says ``copied``, by compare-and-set, only if the attempt is still the one it
   names; a superseded attempt deletes its own object.
6. With a deletion lag of 0, the metadata says ``released`` at once (after the object's size is
   checked again); otherwise the autorecovery leader releases it once the lag has passed.
   The bookies drop a released ledger at their next garbage collection.

A ``copying`` attempt younger than ``stale_after`` belongs to a live offloader and is left to
it; an older one is taken over, its object and unfinished uploads deleted first.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Final

from aiobk.client.context import ClientContext
from aiobk.client.digest import CopyChecker, Digester
from aiobk.client.offload import steps as step
from aiobk.client.offload.refs import offload_ref
from aiobk.client.offload.steps import NO_STEPS, Steps
from aiobk.client.passwords import check_password
from aiobk.client.range_read import RangeReader
from aiobk.client.read import EntryReader
from aiobk.metadata import (
    LedgerMetadata,
    OffloadRecord,
    OffloadState,
    OffloadStoreSettings,
)
from aiobk.protocol.errors import BKError, MalformedObjectError, NoSuchLedgerError
from aiobk.protocol.offload_object import DEFAULT_BLOCK_SIZE, ObjectHeader
from aiobk.tiered.objects import object_key, verify_object, write_object
from aiobk.tiered.open import StoreCache
from aiobk.tiered.store import ObjectStore

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER: Final = 3600.0  # seconds before a copying attempt is taken over
# The offloader's read window: a bulk copy of a closed ledger, not a reader's page. Eight runs
# of 1 MiB ahead keep the bookies busy; a log's ledgers are copied several at once
# (``offload.log.DEFAULT_CONCURRENCY``), so the windows add up.
OFFLOAD_READ_CONCURRENCY: Final = 256
OFFLOAD_READ_AHEAD_BYTES: Final = 8 * 1024 * 1024


class OffloadSupersededError(BKError):
    """Another attempt took the ledger's offload over (or the ledger was deleted) while this
    one ran; this one's object is deleted and nothing else changes."""


@dataclass(frozen=True, slots=True)
class LedgerOffload:
    """What an offload of one ledger did.

    ``outcome`` is one of: ``copied`` (the object is complete and recorded; the bookies keep
    their copies until the lag passes), ``released`` (the bookies may drop theirs), ``open``
    (not offloaded: the ledger is not closed), ``busy`` (another offloader's attempt is in
    progress), ``done`` (offloaded before)."""

    ledger_id: int
    outcome: str
    size: int = 0  # the object's bytes
    entries: int = 0


def _ms(now: Callable[[], float]) -> int:
    return int(now() * 1000)


async def offload_ledger(
    ctx: ClientContext,
    objects: StoreCache,
    settings: OffloadStoreSettings,
    ledger_id: int,
    *,
    now: Callable[[], float],
    password: bytes | None = None,
    steps: Steps = NO_STEPS,
    stale_after: float = DEFAULT_STALE_AFTER,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> LedgerOffload:
    """Offload ``ledger_id`` to the store ``settings`` names (see the module docstring).

    ``password`` lets every entry's digest be checked on the way; without it a MAC ledger's
    entries are checked by ids only (the object's own CRCs still cover the copy). Raises
    ``OffloadSupersededError`` when another attempt took over, ``MalformedObjectError`` when the
    object read back is not what was written (the object is deleted; the bookies are
    untouched), ``UnauthorizedError`` for a wrong ``password``, and the store's and bookies'
    errors as they come."""
    metadata = await ctx.store.read_ledger(ledger_id)
    if password is not None:
        check_password(ledger_id, metadata, password)  # a wrong one is refused, not a copy
    if not metadata.is_closed:
        return LedgerOffload(ledger_id, "open")
    existing = metadata.offload
    if existing is not None and existing.state is not OffloadState.COPYING:
        if existing.state is OffloadState.COPIED and settings.deletion_lag <= 0:
            await release(ctx, objects, ledger_id, now=now, steps=steps)
            return LedgerOffload(ledger_id, "released", existing.size, existing.entries)
        return LedgerOffload(ledger_id, "done", existing.size, existing.entries)
    if existing is not None and _ms(now) - existing.started < stale_after * 1000:
        return LedgerOffload(ledger_id, "busy")
    store = objects.get(settings.url)
    if existing is not None:
        await discard(objects.get(existing.store), existing.key)
    uid = f"{ctx.rng.getrandbits(128):032x}"
    key = object_key(ledger_id, uid)
    await ctx.store.add_offloading(ledger_id, listed_at=_ms(now))
    await steps.at(step.LISTED)
    attempt = OffloadRecord(
        uid=uid,
        store=settings.url,
        key=key,
        state=OffloadState.COPYING,
        started=_ms(now),
        block_size=block_size,
    )
    taken = existing

    def begin(current: LedgerMetadata) -> LedgerMetadata:
        if current.offload != taken:
            raise OffloadSupersededError(f"ledger {ledger_id}: another offload took it over")
        return current.with_offload(attempt)

    metadata = await ctx.store.update_ledger(ledger_id, begin)
    await steps.at(step.COPYING)
    try:
        record = await _copy(ctx, store, ledger_id, metadata, attempt, password, steps)
    except Exception as exc:
        # A failure (the store, a bookie) takes the attempt back at once, so that a retry
        # need not wait for it to go stale; a crash leaves it to the upkeep pass.
        with contextlib.suppress(BKError, ValueError):
            await take_back(ctx, objects, ledger_id, attempt)
        if isinstance(exc, BKError) and not isinstance(exc, NoSuchLedgerError):
            try:
                await ctx.store.read_ledger(ledger_id)
            except NoSuchLedgerError:  # deleted meanwhile, its object with it: say that
                raise NoSuchLedgerError(
                    f"ledger {ledger_id} was deleted while it was offloaded"
                ) from exc
        raise
    return await _record_copied(ctx, objects, settings, ledger_id, record, now, steps)


async def _copy(
    ctx: ClientContext,
    store: ObjectStore,
    ledger_id: int,
    metadata: LedgerMetadata,
    attempt: OffloadRecord,
    password: bytes | None,
    steps: Steps,
) -> OffloadRecord:
    """Write the object, read it back, and return the attempt's record as ``copied`` will
    hold it. A read-back that does not match deletes the object."""
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    digest: Digester = (
        Digester(metadata.digest_type, password)
        if password is not None
        else CopyChecker(metadata.digest_type)
    )
    config = replace(
        ctx.config,
        read_concurrency=max(ctx.config.read_concurrency, OFFLOAD_READ_CONCURRENCY),
        read_ahead_bytes=max(ctx.config.read_ahead_bytes, OFFLOAD_READ_AHEAD_BYTES),
    )
    reader = RangeReader(
        EntryReader(ledger_id, digest, ctx.pool, config, ctx.stats),
        digest,
        ctx.pool,
        config.read_timeout,
        config.read_ahead_bytes,
        ctx.stats,
    )

    async def runs() -> AsyncIterator[list[bytes]]:
        if last < 0:
            return
        passed = 0  # bytes handed to the object, until a block of them has gone
        async for run in reader.runs(metadata, 0, last):
            yield run
            if passed >= 0:
                passed += sum(map(len, run))
                if passed > 2 * attempt.block_size:  # part of the object is in the store
                    passed = -1
                    await steps.at(step.UPLOADING)

    header = ObjectHeader(
        ledger_id=ledger_id,
        first_entry=0,
        last_entry=last,
        uid=bytes.fromhex(attempt.uid),
        digest_type=int(metadata.digest_type),
    )
    footer = await write_object(store, attempt.key, header, runs(), attempt.block_size)
    await steps.at(step.WRITTEN)
    copied = replace(
        attempt,
        size=footer.object_length,
        index_offset=footer.index_offset,
        index_length=footer.index_length,
        index_crc=footer.index_crc,
        entries=footer.entry_count,
    )
    ref = offload_ref(ledger_id, metadata.with_offload(replace(copied, state=OffloadState.COPIED)))
    assert ref is not None
    try:
        await verify_object(store, ref)
    except MalformedObjectError:
        log.error("ledger %d: the object read back does not match; deleting it", ledger_id)
        await store.delete(attempt.key)
        raise
    await steps.at(step.VERIFIED)
    return copied


async def _record_copied(
    ctx: ClientContext,
    objects: StoreCache,
    settings: OffloadStoreSettings,
    ledger_id: int,
    record: OffloadRecord,
    now: Callable[[], float],
    steps: Steps,
) -> LedgerOffload:
    copied = replace(record, state=OffloadState.COPIED, copied=_ms(now))

    def finish(current: LedgerMetadata) -> LedgerMetadata:
        if current.offload is None or current.offload.uid != record.uid:
            raise OffloadSupersededError(f"ledger {ledger_id}: another offload took it over")
        return current.with_offload(copied)

    try:
        await ctx.store.update_ledger(ledger_id, finish)
    except (OffloadSupersededError, NoSuchLedgerError):
        await discard(objects.get(record.store), record.key)
        raise
    await steps.at(step.COPIED)
    log.info("ledger %d: offloaded to %s (%d bytes)", ledger_id, record.key, record.size)
    if settings.deletion_lag <= 0:
        await release(ctx, objects, ledger_id, now=now, steps=steps)
        return LedgerOffload(ledger_id, "released", record.size, record.entries)
    return LedgerOffload(ledger_id, "copied", record.size, record.entries)


async def release(
    ctx: ClientContext,
    objects: StoreCache,
    ledger_id: int,
    *,
    now: Callable[[], float],
    steps: Steps = NO_STEPS,
) -> bool:
    """Mark a copied ledger released, so its bookies drop their copies: only once the object
    is still there at its recorded size. False when it is not (the ledger stays copied, and
    the bookies keep it); True once released (or released already)."""
    metadata = await ctx.store.read_ledger(ledger_id)
    record = metadata.offload
    if record is None or record.state is OffloadState.COPYING:
        return False
    if record.state is OffloadState.RELEASED:
        return True
    size = await objects.get(record.store).size(record.key)
    if size != record.size:
        log.error(
            "ledger %d: its object %s holds %s bytes, not %d; not released",
            ledger_id, record.key, size, record.size,
        )  # fmt: skip
        return False
    released = replace(record, state=OffloadState.RELEASED, released=_ms(now))

    def mark(current: LedgerMetadata) -> LedgerMetadata | None:
        if current.offload is None or current.offload.uid != record.uid:
            raise OffloadSupersededError(f"ledger {ledger_id}: its offload changed")
        if current.offload.state is OffloadState.RELEASED:
            return None
        return current.with_offload(released)

    await ctx.store.update_ledger(ledger_id, mark)
    await steps.at(step.RELEASED)
    return True


async def forget_offload(
    ctx: ClientContext, objects: StoreCache, ledger_id: int, record: OffloadRecord
) -> None:
    """After a ledger's metadata is deleted: its object, and its work-list entry. A store
    that fails now leaves an object no metadata names, which the sweep removes."""
    try:
        await discard(objects.get(record.store), record.key)
    except (BKError, ValueError) as exc:
        log.warning(
            "ledger %d deleted; its object %s stays for the sweep: %s", ledger_id, record.key, exc
        )
    await ctx.store.remove_offloading(ledger_id)


async def take_back(
    ctx: ClientContext, objects: StoreCache, ledger_id: int, attempt: OffloadRecord
) -> bool:
    """Undo an attempt that will not finish (it failed, or died long ago): its object and
    uploads deleted, then its record cleared and the ledger taken off the work list, if the
    record still names it. Whether it was taken back."""
    await discard(objects.get(attempt.store), attempt.key)

    def clear(current: LedgerMetadata) -> LedgerMetadata | None:
        if current.offload is None or current.offload.uid != attempt.uid:
            return None  # taken over meanwhile: the new attempt is not this one's to clear
        return current.with_offload(None)

    try:
        after = await ctx.store.update_ledger(ledger_id, clear)
    except NoSuchLedgerError:
        return False
    if after.offload is not None:
        return False
    log.warning("ledger %d: offload attempt %s taken back", ledger_id, attempt.uid)
    await ctx.store.remove_offloading(ledger_id)
    return True


async def discard(store: ObjectStore, key: str) -> None:
    """Delete an attempt's object and any upload of it left unfinished."""
    for upload in await store.uploads(key):
        if upload.key == key:
            await store.abort(upload)
    await store.delete(key)


__all__ = [
    "DEFAULT_STALE_AFTER",
    "LedgerOffload",
    "OffloadSupersededError",
    "discard",
    "forget_offload",
    "offload_ledger",
    "release",
    "take_back",
]
