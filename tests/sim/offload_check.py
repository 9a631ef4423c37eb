"""The offload profile's invariants (docs/design/invariants.md), judged once the run is healed:

- I18 offload: every ledger whose metadata says copied or released reads back byte for byte
  from its object, each acknowledged log record as it was acknowledged; a ledger is released
  only after it was copied under the same attempt and the store's deletion lag has passed;
  and once the offload passes are quiet, an upkeep with a clock past ``offload_stale_after``
  and a sweep have run, the store holds exactly the objects metadata names and no unfinished
  upload, and the work list names exactly the ledgers with an offload record.
- I19 autorecovery: no under-replication mark stays on an offloaded ledger, and no version of
  an offloaded ledger's metadata moves a copy (a repair's swap) after the offload was recorded.
- I14 over the reader's whole reads of the log (``History.log_reads``), through ledgers the
  bookies released: positions rising, no record twice, none never appended, every
  acknowledged record at its position as acknowledged and none missing below the last read.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiobk.client import BookKeeper, LogPosition
from aiobk.client.log.position import log_record
from aiobk.client.offload import offload_ref, sweep, upkeep
from aiobk.metadata import LedgerMetadata, OffloadState, OffloadStoreSettings
from aiobk.protocol import parse_entry
from aiobk.protocol.errors import BKError
from aiobk.tiered.objects import ObjectReader, verify_object
from tests.sim.history import History
from tests.sim.objstore import TIMEOUT
from tests.sim.workload import LOG
from tests.sim.world import World


async def check_offload(world: World, history: History, bk: BookKeeper) -> None:
    """I18 and I19 (the module docstring), after the rest of the checker."""
    objects, config = world.objects, world.autorecovery
    if objects is None or config is None:
        return
    store = world.store()
    settings = await store.read_offload_store()
    if settings is None:
        history.violations.append("I18 the cluster's offload store was never set")
        return
    with contextlib.suppress(BKError):  # no new attempts: the passes' work winds down
        await store.set_offload_policy(LOG, None)
    objects.heal()
    await asyncio.sleep(3 * (config.offload_interval + TIMEOUT))
    loop = asyncio.get_running_loop()
    stale = config.offload_stale_after
    cache = world.store_cache("checker")
    kept = await upkeep(
        bk.context, cache, settings, now=lambda: loop.time() + stale + 1.0, stale_after=stale
    )
    swept = await sweep(bk.context, cache.get(settings.url))
    world.trace(f"checker: upkeep {kept}, sweep {swept}")
    ledgers = {
        ledger_id: metadata
        async for ledger_id, metadata in store.scan_ledgers()
        if metadata is not None
    }
    recorded = {i: m for i, m in ledgers.items() if m.offload is not None}
    stats = history.offload
    for state in OffloadState:
        stats[state.value] = sum(m.offload.state is state for m in recorded.values() if m.offload)
    await _read_back(world, history, recorded)
    _check_store(world, history, recorded)
    listed = sorted([ledger_id async for ledger_id in store.list_offloading()])
    if listed != sorted(recorded):
        history.violations.append(
            f"I18 the work list names {listed}; the ledgers with an offload record are "
            f"{sorted(recorded)}"
        )
    _check_history(world, history, settings)
    async for mark in store.autorecovery.marks():
        metadata = ledgers.get(mark.ledger_id)
        if metadata is not None and metadata.is_offloaded:
            history.violations.append(
                f"I19 ledger {mark.ledger_id} is offloaded ({metadata.offload}) but still "
                f"marked under-replicated ({mark})"
            )
    check_log_reads(history)


def _check_store(world: World, history: History, recorded: dict[int, LedgerMetadata]) -> None:
    objects = world.objects
    assert objects is not None
    named = {m.offload.key for m in recorded.values() if m.offload is not None}
    copying = sorted(
        i for i, m in recorded.items() if m.offload and m.offload.state is OffloadState.COPYING
    )
    if copying:
        history.violations.append(f"I18 ledgers {copying} still copying after an upkeep")
    held = set(objects.objects)
    if held != named:
        history.violations.append(
            f"I18 after an upkeep and a sweep the store holds {sorted(held - named)} that no "
            f"metadata names and lacks {sorted(named - held)} that metadata names"
        )
    unfinished = objects.unfinished()
    if unfinished:
        history.violations.append(f"I18 unfinished uploads after a sweep: {unfinished}")


async def _read_back(world: World, history: History, recorded: dict[int, LedgerMetadata]) -> None:
    """Each copied or released ledger from its object alone, checked against what the log's
    writers were acknowledged."""
    objects = world.objects
    assert objects is not None
    acknowledged = {op.position: op.value for op in history.log_appends if op.result == "ok"}
    try:
        record_format = (await world.store().read_log(LOG)).record_format
    except BKError:
        record_format = ""
    for ledger_id, metadata in sorted(recorded.items()):
        ref = offload_ref(ledger_id, metadata)
        if ref is None:
            continue
        try:
            await verify_object(objects, ref, None)
            read = (
                {
                    entry_id: raw
                    async for entry_id, raw in ObjectReader(objects, ref).bodies(0, ref.last_entry)
                }
                if ref.last_entry >= 0
                else {}
            )
        except (BKError, ValueError) as exc:
            history.violations.append(f"I18 ledger {ledger_id}: its object does not read: {exc!r}")
            continue
        if sorted(read) != list(range(ref.last_entry + 1)):
            history.violations.append(
                f"I18 ledger {ledger_id}: its object holds entries {sorted(read)[:5]}..., not "
                f"0..{ref.last_entry}"
            )
        for entry_id, raw in sorted(read.items()):
            body = parse_entry(raw)
            if (body.ledger_id, body.entry_id) != (ledger_id, entry_id):
                history.violations.append(
                    f"I18 ledger {ledger_id}: its object holds {body.ledger_id}/{body.entry_id} "
                    f"as entry {entry_id}"
                )
                continue
            expected = acknowledged.get((ledger_id, entry_id))
            if expected is None:
                continue
            at = LogPosition(ledger_id, entry_id)
            value = log_record(at, bytes(body.payload), record_format).data
            if value != expected:
                history.violations.append(
                    f"I18 ledger {ledger_id}: entry {entry_id} in its object is {value!r}, "
                    f"acknowledged as {expected!r}"
                )


def _check_history(world: World, history: History, settings: OffloadStoreSettings) -> None:
    """Over every version of every ledger's metadata: released only from copied under the
    same attempt, the deletion lag after; and once offloaded, no closed fragment's bookies
    changed (no repair's copy)."""
    keys = world.store().keys
    last: dict[int, LedgerMetadata] = {}
    offloaded: dict[int, LedgerMetadata] = {}  # the first version that said copied or released
    lag = int(settings.deletion_lag * 1000)
    for event in world.kv._history:
        if not event.key.startswith(keys.ledgers):
            continue
        ledger_id = keys.ledger_id(event.key)
        if event.value is None:
            last.pop(ledger_id, None)
            offloaded.pop(ledger_id, None)
            continue
        try:
            metadata = LedgerMetadata.from_json(event.value)
        except ValueError:
            continue  # I7's to report
        before, last[ledger_id] = last.get(ledger_id), metadata
        record = metadata.offload
        if record is not None and record.state is OffloadState.RELEASED:
            prior = None if before is None else before.offload
            if (
                prior is not None
                and prior.state is not OffloadState.RELEASED
                and (prior.uid != record.uid or prior.state is not OffloadState.COPIED)
            ):
                history.violations.append(
                    f"I18 ledger {ledger_id} released from {prior.state.value} {prior.uid}, "
                    f"not from copied {record.uid}"
                )
            if (
                record.copied is None
                or record.released is None
                or (record.released - record.copied < lag)
            ):
                history.violations.append(
                    f"I18 ledger {ledger_id} released at {record.released} ms, copied at "
                    f"{record.copied} ms: before the deletion lag of {lag} ms"
                )
        first = offloaded.get(ledger_id)
        if first is None:
            if metadata.is_offloaded:
                offloaded[ledger_id] = metadata
            continue
        then = [(f.first_entry_id, f.ensemble) for f in first.fragments]
        now = [(f.first_entry_id, f.ensemble) for f in metadata.fragments]
        if now != then:
            history.violations.append(
                f"I19 ledger {ledger_id}: its bookies changed after it was offloaded: "
                f"{then} -> {now}"
            )
            offloaded[ledger_id] = metadata


def check_log_reads(history: History) -> None:
    """I14 over each whole read of the log (the module docstring)."""
    acknowledged = {op.position: op.value for op in history.log_appends if op.result == "ok"}
    invoked = {op.value for op in history.log_appends}
    for read in history.log_reads:
        if not read.records:
            continue
        positions = [position for position, _ in read.records]
        if positions != sorted(set(positions)):
            history.violations.append(f"I14 {read.who} read positions out of order: {positions}")
        seen: dict[bytes, tuple[int, int]] = {}
        got = dict(read.records)
        for position, value in read.records:
            if value not in invoked:
                history.violations.append(f"I14 {read.who} read {value!r}, never appended")
            if value in seen:
                history.violations.append(
                    f"I14 {read.who} read {value!r} at {seen[value]} and at {position}"
                )
            seen[value] = position
        end = positions[-1]
        for position, value in acknowledged.items():
            if position > end or position[0] < read.truncated_below:
                continue
            if got.get(position) != value:
                history.violations.append(
                    f"I14 {read.who} read the log up to {end} but found {got.get(position)!r} "
                    f"at {position}, acknowledged as {value!r}"
                )
