"""The end of a run: heal every fault, bring every bookie back (but those lost for good),
recover and read every ledger with a client that follows every rule, then check I1-I14 against
the history, the bookies' stored copies and the metadata's whole version history -- and, when
autorecovery runs in the bookies (the loss profiles), I15 once it has nothing left to do; over
the logs of the producers profile, I17 (tests.sim.sequences); I18 and I19 in the offload profile
(tests.sim.offload_check).
"""

from __future__ import annotations

import asyncio
import contextlib

from aiobk.autorecovery import Auditor
from aiobk.autorecovery.fragments import closed_fragments, slot_entries
from aiobk.bookie.entrylog.format import CorruptEntryError
from aiobk.client import BookKeeper, LogPosition, ReadHandle
from aiobk.client.log.position import LogRecord, log_record
from aiobk.client.quorum import write_set
from aiobk.metadata import LedgerMetadata, LedgerState, LogMetadata
from aiobk.protocol import parse_entry
from aiobk.protocol.errors import BKError, NoSuchLedgerError
from tests.sim.history import History
from tests.sim.loss import unrepaired
from tests.sim.offload_check import check_offload
from tests.sim.racks import check_spread_again
from tests.sim.sequences import check_producers, spans
from tests.sim.workload import LOG
from tests.sim.world import SimBookie, World

RECOVERY_ATTEMPTS = 12
QUIESCE_LIMIT = 90.0  # virtual seconds for autorecovery to finish after the faults healed


async def heal(world: World) -> None:
    world.net.heal()
    world.net.slow = 0.0
    world.release_holds()
    if world.objects is not None:
        world.objects.heal()
    for sim in world.bookies.values():
        sim.disk.full = False
        sim.disk.read_errors = 0.0
    for sim in world.bookies.values():
        if sim.lost_forever:
            continue  # gone for good: autorecovery, not a restart, must make up for it
        for _attempt in range(3):
            if sim.up or await world.start_bookie(sim):
                break
            await asyncio.sleep(1.0)
        else:
            world.violations.append(f"I13 {sim.node} does not boot after the faults healed")


async def wait_repaired(world: World) -> None:
    """BP-46 phase two on every bookie. A bookie that lost a ledger's master key waits for a
    client to close that ledger, so this runs after the checker's recoveries."""
    for sim in world.bookies.values():
        if sim.bookie is not None:
            try:
                await asyncio.wait_for(sim.bookie.wait_repaired(), 60)
            except (TimeoutError, Exception) as exc:
                world.violations.append(f"I13 {sim.node}: boot repair did not finish: {exc!r}")


async def _recover(world: World, bk: BookKeeper, ledger_id: int) -> ReadHandle | None:
    """Open with recovery, retrying while bookies come back; None if it never succeeds."""
    for _attempt in range(RECOVERY_ATTEMPTS):
        try:
            return await bk.open_ledger(ledger_id, recovery=True)
        except BKError as exc:
            world.trace(f"checker: recovery of {ledger_id}: {type(exc).__name__}: {exc}")
            await asyncio.sleep(0.5)
    return None


async def check(world: World, history: History) -> dict[int, LedgerMetadata]:
    """Recover and read every ledger; append violations to ``history``. Returns the final
    metadata of each ledger that could be recovered."""
    bk = await world.client("checker", switches=False)
    final: dict[int, LedgerMetadata] = {}
    handles = {}
    gone = await _deleted(bk, history)
    for ledger_id in sorted(set(history.ledgers) - gone):
        handle = await _recover(world, bk, ledger_id)
        if handle is None:
            history.violations.append(f"I13 ledger {ledger_id} cannot be recovered after healing")
            continue
        handles[ledger_id] = handle
    # Before the repairs: they may wait for these closes.
    await _close_log_ledgers(world, history, bk)
    await wait_repaired(world)
    restoring = world.autorecovery is not None
    if restoring:
        # Before the GC pass: a worker may still be copying a deleted ledger somewhere.
        await quiesce(world, history)
    await _check_gc(world, history, gone)
    for ledger_id, recovered in handles.items():
        handle = recovered
        if restoring:  # the ensembles as autorecovery left them, not as recovery saw them
            await recovered.close()
            reopened = await _recover(world, bk, ledger_id)
            if reopened is None:
                history.violations.append(f"I13 ledger {ledger_id} cannot be opened after repair")
                continue
            handle = reopened
        metadata = handle.metadata
        final[ledger_id] = metadata
        last, values = await read_closed(history, handle)
        await handle.close()
        _check_ledger(history, ledger_id, last, values)
        await _check_copies(world, history, ledger_id, metadata)
    _check_reads(history, final)
    await _check_log(world, history, bk)
    await _check_producer_logs(world, history, bk)
    _check_metadata_history(world, history)
    if restoring:
        await check_restored(world, history)
        if world.racked:
            await check_spread_again(world, history)
    await check_offload(world, history, bk)
    return final


def _auditor(world: World) -> Auditor | None:
    for sim in world.bookies.values():
        companion = world.companion(sim)
        if companion is not None and companion.auditor is not None:
            return companion.auditor
    return None


async def quiesce(world: World, history: History) -> None:
    """Before I15 is judged: the elected auditor's full check of every ledger (every
    owed entry asked: ``loss.autorecovery_config``), then until autorecovery has nothing left --
    no mark lists missing bookies and no ledger names a bookie lost for good -- for a few
    polls in a row. Bounded: what is left then is for I15 to report."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIESCE_LIMIT
    store = world.store()
    for _attempt in range(3):
        auditor = _auditor(world)
        while auditor is None and loop.time() < deadline:
            await asyncio.sleep(0.2)
            auditor = _auditor(world)
        if auditor is None:
            history.violations.append("I15 no auditor was elected after the faults healed")
            break
        try:
            await asyncio.wait_for(auditor.check_all(), 60)
            break
        except (TimeoutError, BKError) as exc:
            world.trace(f"checker: the final audit failed: {exc!r}")
    calm = 0
    while calm < 3:
        naming, marked = await unrepaired(store, world.lost)
        calm = 0 if naming or marked else calm + 1
        if loop.time() >= deadline:
            world.trace(f"checker: autorecovery still busy: naming {naming}, marked {marked}")
            for ledger_id in marked:
                history.violations.append(
                    f"I15 ledger {ledger_id} still marked under-replicated {QUIESCE_LIMIT:g}s "
                    "after the faults healed"
                )
            return
        await asyncio.sleep(0.5)
    world.trace("checker: autorecovery has nothing left to do")


def _within(entry_id: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(low <= entry_id <= high for low, high in ranges)


async def _holds(sim: SimBookie, ledger_id: int, entry_id: int) -> bool:
    """Whether the bookie's storage holds the entry (read directly, no request)."""
    assert sim.bookie is not None
    state = sim.bookie.storage.ledgers.get(ledger_id)
    if state is None:
        return False
    body = None
    with contextlib.suppress(CorruptEntryError, OSError):
        body = await sim.bookie.storage.read_entry(state, entry_id)
    if body is None:
        return False
    parsed = parse_entry(body)
    return (parsed.ledger_id, parsed.entry_id) == (ledger_id, entry_id)


async def check_restored(world: World, history: History) -> None:
    """I15 (copies restored), on the metadata as the store holds it now: every entry of every
    closed ledger has a copy on each bookie its fragment's write set names (read from that
    bookie's storage), and every bookie named in any ensemble is alive -- or the ledger is
    reported lost: its mark's ``lost`` ranges cover the entries missing."""
    store = world.store()
    alive = {sim.bookie_id: sim for sim in world.bookies.values() if sim.bookie is not None}
    lost_forever = world.lost
    reports = {mark.ledger_id: mark.lost async for mark in store.autorecovery.marks()}
    stats = world.restored
    stats.setdefault("lost_reports", 0)
    async for ledger_id, metadata in store.scan_ledgers():
        if metadata is None or metadata.is_offloaded:
            continue  # an offloaded ledger's copy is its object (I18)
        ranges = reports.get(ledger_id, ())
        stats["lost_reports"] += bool(ranges)
        e, wq = metadata.ensemble_size, metadata.write_quorum
        fragments = closed_fragments(metadata)
        if metadata.state is not LedgerState.CLOSED:  # the writer's fragment: named only
            tail = metadata.fragments[-1]
            for bookie in tail.ensemble:
                if bookie not in alive:
                    history.violations.append(
                        f"I15 ledger {ledger_id} ({metadata.state.value}): its last fragment "
                        f"(from entry {tail.first_entry_id}) names {bookie}, "
                        + ("lost for good" if bookie in lost_forever else "down")
                    )
        for fragment in fragments:
            for slot, bookie in enumerate(fragment.ensemble):
                owed = [
                    x
                    for x in slot_entries(fragment.first, fragment.last, slot, e, wq)
                    if not _within(x, ranges)
                ]
                sim = alive.get(bookie)
                if sim is None:
                    if owed or not ranges:
                        history.violations.append(
                            f"I15 ledger {ledger_id}: the fragment of entries "
                            f"{fragment.first}-{fragment.last} names {bookie}, "
                            + ("lost for good" if bookie in lost_forever else "down")
                            + (f", for entries {spans(owed)}" if owed else "")
                            + (f" (reported lost: {list(ranges)})" if ranges else "")
                        )
                    continue
                if metadata.state is not LedgerState.CLOSED:
                    continue  # I15 asks every copy of closed ledgers only
                lacking = [x for x in owed if not await _holds(sim, ledger_id, x)]
                if lacking:
                    history.violations.append(
                        f"I15 ledger {ledger_id}: {sim.node} lacks entries {spans(lacking)} "
                        f"that its fragment from entry {fragment.first} names it for"
                        + (f" (reported lost: {list(ranges)})" if ranges else "")
                    )
    _count_moves(world)


def _count_moves(world: World) -> None:
    """For the summary (and the trace): autorecovery's swaps in the metadata's history -- a
    closed fragment whose ensemble changed in place -- and those that moved a bookie that was
    never lost (never down past ``lost_bookie_recovery_delay``): needless moves, the ones a
    returning bookie should be spared (pulsar#1886)."""
    assert world.autorecovery is not None
    delay = world.autorecovery.lost_bookie_recovery_delay
    keys = world.store().keys
    by_id = {sim.bookie_id: sim for sim in world.bookies.values()}
    previous: dict[int, LedgerMetadata] = {}
    swaps = needless = 0
    for event in world.kv._history:
        if not event.key.startswith(keys.ledgers):
            continue
        ledger_id = keys.ledger_id(event.key)
        if event.value is None:
            previous.pop(ledger_id, None)
            continue
        try:
            metadata = LedgerMetadata.from_json(event.value)
        except ValueError:
            continue
        before = previous.get(ledger_id)
        previous[ledger_id] = metadata
        if before is None:
            continue
        fixed = len(before.fragments) - (0 if before.is_closed else 1)
        now = {f.first_entry_id: f.ensemble for f in metadata.fragments}
        for fragment in before.fragments[:fixed]:
            after = now.get(fragment.first_entry_id)
            if after is None or after == fragment.ensemble:
                continue
            for old, new in zip(fragment.ensemble, after, strict=False):
                if old == new:
                    continue
                swaps += 1
                sim = by_id.get(old)
                if sim is not None and not sim.lost_forever and sim.longest_outage < delay:
                    needless += 1
                    world.trace(
                        f"checker: ledger {ledger_id} fragment {fragment.first_entry_id}: "
                        f"{old} moved to {new} though never down {delay:g}s"
                    )
    world.restored["swaps"] = swaps
    world.restored["needless_moves"] = needless


async def read_closed(history: History, handle: ReadHandle) -> tuple[int, dict[int, bytes]]:
    """A recovered ledger's last entry and every value up to it (I2 if they do not read)."""
    metadata = handle.metadata
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    values: dict[int, bytes] = {}
    if last >= 0:
        try:
            values = {e.entry_id: bytes(e.data) for e in await handle.read(0, last)}
        except BKError as exc:
            history.violations.append(
                f"I2 ledger {handle.ledger_id}: entries 0..{last} do not read back: {exc!r}"
            )
    return last, values


async def _deleted(bk: BookKeeper, history: History) -> set[int]:
    """The ledgers the workload deleted (a failed delete may or may not have happened)."""
    gone = set()
    for ledger_id in sorted(history.deleted):
        try:
            await bk.store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            gone.add(ledger_id)
    return gone


async def _check_gc(world: World, history: History, gone: set[int]) -> None:
    """One more garbage-collection pass on every bookie: it must drop every deleted ledger
    it holds (the live ones are read back afterwards, so a pass that took too much shows)."""
    for sim in world.bookies.values():
        bookie = sim.bookie
        if bookie is None or not bookie.running:
            continue
        result = await bookie.collect_garbage()
        if result.skipped:
            history.violations.append(f"GC {sim.node}: pass skipped: {result.skipped}")
        for ledger_id in sorted(gone & set(bookie.storage.ledgers)):
            history.violations.append(
                f"GC {sim.node}: still holds deleted ledger {ledger_id} after a pass"
            )


async def _close_log_ledgers(world: World, history: History, bk: BookKeeper) -> None:
    """Recover every ledger of the logs, as the next writer would. A bookie that lost a
    ledger's master key (it crashed before any add of it was durable) can only finish its boot
    repair once someone with the password has closed that ledger."""
    for name in (LOG, *sorted(history.producer_logs)):
        try:
            record = await bk.store.read_log(name)
        except BKError:
            continue
        for ledger_id in record.ledgers:
            await _recover(world, bk, ledger_id)
    if history.producer_logs:
        await _close_orphans(world, history, bk)


async def _close_orphans(world: World, history: History, bk: BookKeeper) -> None:
    """Recover the ledgers made for a producer log that never joined it: a producer killed
    between creating its next ledger and putting it in the log leaves it open, and nobody
    else knows it (an operator's sweep of ledgers that name a log which lacks them)."""
    names = {name.encode() for name in history.producer_logs}
    orphans = []
    async for ledger_id in bk.store.list_ledgers():
        try:
            metadata = await bk.store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            continue
        if not metadata.is_closed and metadata.custom_metadata.get("log") in names:
            orphans.append(ledger_id)
    for ledger_id in orphans:
        world.trace(f"checker: recovering ledger {ledger_id}, made for a log it never joined")
        await _recover(world, bk, ledger_id)


async def _read_log(
    world: World, history: History, bk: BookKeeper, name: str
) -> tuple[LogMetadata, dict[tuple[int, int], LogRecord]] | None:
    """The log's record and every record in it by position. Each of its ledgers is recovered
    (closing one a dead writer left open), read whole, and its copies checked."""
    try:
        record = await bk.store.read_log(name)
    except BKError as exc:
        history.violations.append(f"I14 log {name} unreadable: {exc!r}")
        return None
    if list(record.ledgers) != sorted(record.ledgers):
        history.violations.append(f"I14 log {name}: ledgers out of order {record.ledgers}")
    found: dict[tuple[int, int], LogRecord] = {}
    for ledger_id in record.ledgers:
        handle = await _recover(world, bk, ledger_id)
        if handle is None:
            history.violations.append(f"I13 log ledger {ledger_id} cannot be recovered")
            continue
        last = handle.last_add_confirmed
        if last >= 0:
            try:
                for entry in await handle.read(0, last):
                    at = LogPosition(ledger_id, entry.entry_id)
                    found[(ledger_id, entry.entry_id)] = log_record(
                        at, bytes(entry.data), record.record_format
                    )
            except BKError as exc:
                history.violations.append(f"I2 log ledger {ledger_id} unreadable: {exc!r}")
        await _check_copies(world, history, ledger_id, handle.metadata)
    return record, found


async def _check_log(world: World, history: History, bk: BookKeeper) -> None:
    """I14 over the log: every acknowledged append at its position, nothing twice, nothing
    never appended, positions in order."""
    if not history.log_appends:
        return
    read = await _read_log(world, history, bk, LOG)
    if read is None:
        return
    record, records = read
    found = {position: r.data for position, r in records.items()}
    invoked = {op.value for op in history.log_appends}
    seen: dict[bytes, tuple[int, int]] = {}
    for position, value in sorted(found.items()):
        if value not in invoked:
            history.violations.append(f"I14 log: {value!r} at {position} was never appended")
        if value in seen:
            history.violations.append(
                f"I14 log: {value!r} at {seen[value]} and again at {position}"
            )
        seen[value] = position
    truncated_below = max(history.log_truncations, default=-1)
    kept = set(record.ledgers)
    for op in history.log_appends:
        if op.result != "ok":
            continue
        if op.position[0] not in kept and op.position[0] < truncated_below:
            continue  # truncated away
        if found.get(op.position) != op.value:
            history.violations.append(
                f"I14 log: acknowledged {op.value!r} at {op.position} reads back as "
                f"{found.get(op.position)!r}"
            )
    _check_log_order(history)


async def _check_producer_logs(world: World, history: History, bk: BookKeeper) -> None:
    """I17 over every log of the producers profile that a producer appended to (one whose
    every open failed may not exist): ``check_producers``."""
    for name in sorted({op.log for op in history.producer_appends}):
        read = await _read_log(world, history, bk, name)
        if read is not None:
            check_producers(history, name, read[1])


def _check_log_order(history: History) -> None:
    """I14: a writer's acknowledged appends hold positions in the order it called them, across
    rolls, failovers and truncations (``history.log_appends`` is in call order)."""
    last: dict[str, tuple[bytes, tuple[int, int]]] = {}
    for op in history.log_appends:
        if op.result != "ok":
            continue
        before = last.get(op.writer)
        if before is not None and op.position <= before[1]:
            history.violations.append(
                f"I14 log: {op.writer} called {before[0]!r} before {op.value!r}, but they are "
                f"at {before[1]} and {op.position}"
            )
        last[op.writer] = (op.value, op.position)


def _check_ledger(history: History, ledger_id: int, last: int, values: dict[int, bytes]) -> None:
    appends = [a for a in history.appends if a.ledger_id == ledger_id]
    invoked = {a.value for a in appends}
    # BP-14: a volatile append is acknowledged once written, so a crash may take it; what must
    # survive is everything up to the highest LAC anyone saw (I12) -- the LAC only moves over
    # entries synced on an ack quorum.
    durable_upto = history.max_lac(ledger_id) if ledger_id in history.volatile else None
    if ledger_id in history.writer_closed and not history.unsynced_loss:
        durable_upto = None  # closed by its writer, nothing lost: close-to-open keeps it all
    if durable_upto is not None and durable_upto > last:
        history.violations.append(
            f"I12 volatile ledger {ledger_id}: a LAC of {durable_upto} was seen but the ledger "
            f"closed at {last}"
        )
    for op in appends:
        if op.result != "ok":
            continue
        if durable_upto is not None and op.entry_id > durable_upto:
            continue  # written, never synced under a LAC: may be lost
        if op.entry_id > last:  # I1 / I5
            history.violations.append(
                f"I1 ledger {ledger_id}: entry {op.entry_id} was acknowledged but the ledger "
                f"closed at {last}"
            )
        elif values and values.get(op.entry_id) != op.value:  # I2 / I14 lost write
            history.violations.append(
                f"I2 ledger {ledger_id}: acknowledged entry {op.entry_id} = {op.value!r} reads "
                f"back as {values.get(op.entry_id)!r}"
            )
    failed = {a.value for a in appends if a.result == "fail"}
    seen: dict[bytes, int] = {}
    for entry_id, value in sorted(values.items()):
        if value not in invoked:
            history.violations.append(
                f"I14 ledger {ledger_id}: entry {entry_id} holds {value!r}, never appended"
            )
        elif value in failed:
            history.violations.append(
                f"I14 ledger {ledger_id}: entry {entry_id} holds {value!r}, an append that "
                "failed before it was sent"
            )
        if value in seen:
            history.violations.append(
                f"I14 ledger {ledger_id}: {value!r} at entries {seen[value]} and {entry_id}"
            )
        seen[value] = entry_id


async def _check_copies(
    world: World, history: History, ledger_id: int, metadata: LedgerMetadata
) -> None:
    """I3 (AQ copies in the write set) and I6 (identical copies) on the bookies' storage,
    which drop an offloaded ledger once it is released (I18 reads its object instead)."""
    if metadata.is_offloaded:
        return
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    by_id = {sim.bookie_id: sim for sim in world.bookies.values()}
    for entry_id in range(last + 1):
        fragment = metadata.fragment_for(entry_id)
        slots = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
        copies: dict[str, bytes] = {}
        excused = 0
        for slot in slots:
            sim = by_id.get(fragment.ensemble[slot])
            if sim is None or sim.bookie is None:
                excused += 1
                continue
            if sim.lost_data:
                excused += 1
            state = sim.bookie.storage.ledgers.get(ledger_id)
            if state is None:
                continue
            body = None
            with contextlib.suppress(CorruptEntryError, OSError):
                body = await sim.bookie.storage.read_entry(state, entry_id)
            if body is not None:
                copies[sim.node] = parse_entry(body).payload
        if len(set(copies.values())) > 1:
            history.violations.append(
                f"I6 ledger {ledger_id} entry {entry_id}: copies differ: {copies}"
            )
        if len(copies) < metadata.ack_quorum - excused:
            history.violations.append(
                f"I3 ledger {ledger_id} entry {entry_id}: {len(copies)} copies in its write set "
                f"({sorted(copies)}), AQ is {metadata.ack_quorum}"
            )


def _check_reads(history: History, final: dict[int, LedgerMetadata]) -> None:
    """I8: no reader got an entry above the LAC it knew; what it got is the final value."""
    finals: dict[tuple[int, int], bytes] = {}
    for op in history.appends:
        if op.result == "ok":
            finals[(op.ledger_id, op.entry_id)] = op.value
    refused = {op.value for op in history.appends if op.result == "fail"}
    for seen in history.reads:
        if seen.value in refused:
            history.violations.append(
                f"I14 {seen.who} read {seen.value!r}, an append that failed before it was sent"
            )
        if seen.entry_id > seen.known_lac:
            history.violations.append(
                f"I8 {seen.who} read {seen.ledger_id}/{seen.entry_id} above its LAC "
                f"{seen.known_lac}"
            )
        metadata = final.get(seen.ledger_id)
        last = metadata.last_entry_id if metadata is not None else None
        if last is not None and seen.entry_id > last:
            history.violations.append(
                f"I8 {seen.who} read {seen.ledger_id}/{seen.entry_id}, beyond the final last "
                f"entry {last}"
            )
        expected = finals.get((seen.ledger_id, seen.entry_id))
        if expected is not None and expected != seen.value:
            history.violations.append(
                f"I6 {seen.who} read {seen.value!r} at {seen.ledger_id}/{seen.entry_id}, the "
                f"writer was acknowledged {expected!r}"
            )


def _check_metadata_history(world: World, history: History) -> None:
    """I4 (CLOSED once, its last entry never changes) and I7 (valid fragments) over every
    version of every ledger's metadata the store ever held."""
    keys = world.store().keys
    closed: dict[int, tuple[int | None, int]] = {}
    for event in world.kv._history:
        if not event.key.startswith(keys.ledgers) or event.value is None:
            continue
        ledger_id = keys.ledger_id(event.key)
        try:
            metadata = LedgerMetadata.from_json(event.value)
        except ValueError as exc:
            history.violations.append(f"I7 ledger {ledger_id}: invalid metadata stored: {exc}")
            continue
        firsts = [f.first_entry_id for f in metadata.fragments]
        if firsts != sorted(set(firsts)) or firsts[0] != 0:
            history.violations.append(f"I7 ledger {ledger_id}: fragments start at {firsts}")
        if ledger_id in closed:
            if (
                not metadata.is_closed
                or (metadata.last_entry_id, metadata.length) != closed[ledger_id]
            ):
                history.violations.append(
                    f"I4 ledger {ledger_id}: closed at {closed[ledger_id]}, later stored as "
                    f"{metadata.state.name} {metadata.last_entry_id}"
                )
        elif metadata.is_closed:
            closed[ledger_id] = (metadata.last_entry_id, metadata.length)
