"""I15 -- copies restored (docs/design/invariants.md), judged at the end of a chaos run.

Once every fault is healed and every ledger closed, autorecovery is asked for a full audit and
given a bounded time to quiesce (no mark naming a missing bookie). Then, for every closed
ledger: each entry up to the last has a copy on each bookie its fragment's write set names --
asked directly, one plain READ per copy, no client retries or speculation in between -- and
every bookie named in any ensemble is alive (registered). The exception is a ledger whose mark
reports entries with no copy left: those entries, and the fragments holding them, are excused.

A ledger that fails is looked at again (autorecovery may still be copying it) until it holds or
the time is up; what still fails then is a violation. The audit is asked for again when the
auditor changes (a new auditor ignores requests from before its election) and every
``AUDIT_AGAIN`` seconds. All copies read in the last look must also be identical (I6, after
the repairs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from aiobk.client import BookKeeper
from aiobk.client.entry_read import ask
from aiobk.metadata import LedgerMetadata, LedgerState, UnderReplication, write_set
from aiobk.protocol import StatusCode, parse_entry
from aiobk.protocol.errors import BKError, NoSuchLedgerError

AUDIT_AGAIN = 20.0  # seconds between audit requests while something is still missing
LOOK_AGAIN = 0.5  # seconds between looks
READS_IN_FLIGHT = 64
READ_TIMEOUT = 5.0
SHOWN = 5  # problems listed per ledger in a violation


@dataclass
class Restored:
    """What the I15 check saw: ledgers judged, how long autorecovery took to quiesce."""

    ledgers: int = 0
    copies: int = 0  # read in each ledger's last look
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)


async def check_restored(
    bk: BookKeeper, ledger_ids: list[int], bound: float, note: Callable[[str], None]
) -> Restored:
    store = bk.store
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + bound
    out = Restored()
    await store.autorecovery.request_audit()
    asked_of = await store.autorecovery.auditor()
    next_audit = start + AUDIT_AGAIN
    pending = sorted(ledger_ids)
    problems: dict[int, list[str]] = {}
    differing: dict[int, list[str]] = {}  # I6, from each ledger's last look
    copies: dict[int, int] = {}  # copies read in each ledger's last look
    busy: list[UnderReplication] = []
    looks = 0
    for _look in range(int(bound / LOOK_AGAIN) + 1):  # and at most ``bound`` seconds
        marks = {m.ledger_id: m async for m in store.autorecovery.marks()}
        busy = [m for m in marks.values() if m.missing]
        if looks == 0 and marks:
            note(f"I15: {len(marks)} ledgers marked at the audit request")
        looks += 1
        if not busy:
            registered = {info.bookie_id for info in await store.list_bookies()}
            problems = {}
            for ledger_id in pending:
                found = await _ledger(bk, ledger_id, registered, marks.get(ledger_id))
                if found is None:
                    continue  # deleted
                wrong, differing[ledger_id], copies[ledger_id] = found
                if wrong:
                    problems[ledger_id] = wrong
            pending = sorted(problems)
            if not pending:
                break
        now = loop.time()
        if now >= deadline:
            break
        auditor = await store.autorecovery.auditor()
        if now >= next_audit or auditor != asked_of:
            await store.autorecovery.request_audit()  # a new auditor ignores older requests
            asked_of = auditor
            next_audit = now + AUDIT_AGAIN
        await asyncio.sleep(LOOK_AGAIN)
    out.seconds = loop.time() - start
    out.ledgers = len(ledger_ids)
    if busy:
        shown = [(m.ledger_id, m.missing) for m in busy[:SHOWN]]
        out.violations.append(
            f"I15 autorecovery did not quiesce in {bound:g}s: {len(busy)} ledgers still marked "
            f"{shown}"
        )
    for ledger_id, wrong in sorted(problems.items()):
        more = f" (+{len(wrong) - SHOWN} more)" if len(wrong) > SHOWN else ""
        out.violations.append(
            f"I15 ledger {ledger_id} not restored after {out.seconds:.1f}s: "
            f"{'; '.join(wrong[:SHOWN])}{more}"
        )
    out.violations += [line for _id, lines in sorted(differing.items()) for line in lines]
    out.copies = sum(copies.values())
    note(
        f"I15: {out.ledgers} ledgers, {out.copies} copies read in their last looks, "
        f"{out.seconds:.1f}s to quiesce"
    )
    return out


async def _ledger(
    bk: BookKeeper,
    ledger_id: int,
    registered: set[str],
    mark: UnderReplication | None,
) -> tuple[list[str], list[str], int] | None:
    """One ledger's I15 problems, I6 disagreements and copies read; None if it was deleted."""
    try:
        metadata = await bk.store.read_ledger(ledger_id)
    except NoSuchLedgerError:
        return None
    if metadata.state is not LedgerState.CLOSED:
        return [f"still {metadata.state.name} after the final recovery"], [], 0
    lost = mark.lost if mark is not None else ()
    last = metadata.last_entry_id if metadata.last_entry_id is not None else -1

    def excused(first: int, end: int) -> bool:
        return any(a <= end and first <= b for a, b in lost)

    wrong: list[str] = []
    for index, fragment in enumerate(metadata.fragments):
        end = last
        if index + 1 < len(metadata.fragments):
            end = min(last, metadata.fragments[index + 1].first_entry_id - 1)
        dead = [b for b in fragment.ensemble if b not in registered]
        if dead and not excused(fragment.first_entry_id, end):
            wrong.append(f"fragment at {fragment.first_entry_id} names {dead}, not alive")
    copies: dict[int, dict[str, bytes]] = {}
    read = 0
    wanted = (
        (entry_id, bookie)
        for entry_id in range(last + 1)
        if not excused(entry_id, entry_id)
        for bookie in _holders(metadata, entry_id)
    )

    async def reader() -> None:
        nonlocal read
        for entry_id, bookie in wanted:
            try:
                response = await ask(bk.pool, bookie, ledger_id, entry_id, READ_TIMEOUT)
            except BKError as exc:
                wrong.append(f"entry {entry_id} on {bookie}: {type(exc).__name__}")
                continue
            read += 1
            if response.status is StatusCode.EOK and response.body:
                payload = bytes(parse_entry(response.body).payload)
                copies.setdefault(entry_id, {})[bookie] = payload
            else:
                wrong.append(f"entry {entry_id} on {bookie}: {response.status.name}")

    await asyncio.gather(*(reader() for _ in range(READS_IN_FLIGHT)))
    wrong.sort(key=_entry_order)
    differ = [
        f"I6 ledger {ledger_id} entry {entry_id}: copies differ after repair: {sorted(by)}"
        for entry_id, by in sorted(copies.items())
        if len(set(by.values())) > 1
    ]
    return wrong, differ, read


def _holders(metadata: LedgerMetadata, entry_id: int) -> list[str]:
    fragment = metadata.fragment_for(entry_id)
    slots = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
    return [fragment.ensemble[slot] for slot in slots]


def _entry_order(problem: str) -> tuple[int, str]:
    """Fragment problems first, then entries in id order (readers finish out of order)."""
    words = problem.split()
    return (int(words[1]) if words[0] == "entry" else -1, problem)
