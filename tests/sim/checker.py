"""The end of a run: heal every fault, bring every bookie back, recover and read every ledger
with a client that follows every rule, then check I1-I14 against the history, the bookies'
stored copies and the metadata's whole version history.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiobk.bookie.entrylog import CorruptEntryError
from aiobk.client import BookKeeper, ReadHandle
from aiobk.client.quorum import write_set
from aiobk.metadata import LedgerMetadata
from aiobk.protocol import parse_entry
from aiobk.protocol.errors import BKError, NoSuchLedgerError
from tests.sim.history import History
from tests.sim.workload import LOG
from tests.sim.world import World

RECOVERY_ATTEMPTS = 12


async def heal(world: World) -> None:
    world.net.heal()
    world.net.slow = 0.0
    for sim in world.bookies.values():
        sim.disk.full = False
        sim.disk.read_errors = 0.0
    for sim in world.bookies.values():
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
    await _close_log_ledgers(world, bk)  # before the repairs: they may wait for these closes
    await wait_repaired(world)
    await _check_gc(world, history, gone)
    for ledger_id, handle in handles.items():
        metadata = handle.metadata
        final[ledger_id] = metadata
        last, values = await read_closed(history, handle)
        await handle.close()
        _check_ledger(history, ledger_id, last, values)
        await _check_copies(world, history, ledger_id, metadata)
    _check_reads(history, final)
    await _check_log(world, history, bk)
    _check_metadata_history(world, history)
    return final


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


async def _close_log_ledgers(world: World, bk: BookKeeper) -> None:
    """Recover every ledger of the log, as the next writer would. A bookie that lost a ledger's
    master key (it crashed before any add of it was durable) can only finish its boot repair
    once someone with the password has closed that ledger."""
    try:
        record = await bk.store.read_log(LOG)
    except BKError:
        return
    for ledger_id in record.ledgers:
        await _recover(world, bk, ledger_id)


async def _check_log(world: World, history: History, bk: BookKeeper) -> None:
    """I14 over the log: every acknowledged append at its position, nothing twice, nothing
    never appended, positions in order. Each of its ledgers is recovered (closing one a dead
    writer left open) and read whole."""
    if not history.log_appends:
        return
    try:
        record = await bk.store.read_log(LOG)
    except BKError as exc:
        history.violations.append(f"I14 log {LOG} unreadable: {exc!r}")
        return
    if list(record.ledgers) != sorted(record.ledgers):
        history.violations.append(f"I14 log {LOG}: ledgers out of order {record.ledgers}")
    found: dict[tuple[int, int], bytes] = {}
    for ledger_id in record.ledgers:
        handle = await _recover(world, bk, ledger_id)
        if handle is None:
            history.violations.append(f"I13 log ledger {ledger_id} cannot be recovered")
            continue
        last = handle.last_add_confirmed
        if last >= 0:
            try:
                for entry in await handle.read(0, last):
                    found[(ledger_id, entry.entry_id)] = bytes(entry.data)
            except BKError as exc:
                history.violations.append(f"I2 log ledger {ledger_id} unreadable: {exc!r}")
        await _check_copies(world, history, ledger_id, handle.metadata)
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
    for op in history.log_appends:
        if op.result == "ok" and found.get(op.position) != op.value:
            history.violations.append(
                f"I14 log: acknowledged {op.value!r} at {op.position} reads back as "
                f"{found.get(op.position)!r}"
            )


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
    """I3 (AQ copies in the write set) and I6 (identical copies) on the bookies' storage."""
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
