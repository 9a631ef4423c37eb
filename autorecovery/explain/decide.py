"""The verdict: ``explain`` turns a ledger's facts into its explanation. Pure
(``aiobk.autorecovery.explain`` has the theory; ``probes`` says which copies to ask the bookies
about first, ``gather`` does the I/O)."""

from __future__ import annotations

from collections.abc import Mapping

from aiobk.autorecovery.checker import Holding
from aiobk.autorecovery.explain.model import (
    ABSENT,
    AT_RISK,
    BACKOFF,
    BOOKIE_ABSENT,
    BOOKIE_BACK,
    CLAIMED,
    DISABLED,
    GONE,
    GRACE,
    HEALTHY,
    HELD,
    LOST,
    LOST_BOOKIE,
    LOST_ENTRIES,
    MAX_FRAGMENTS_CHECKED,
    MISPLACED,
    MISSING,
    NO_AUTORECOVERY,
    NO_SOURCE,
    NO_SUCH_LEDGER,
    NO_TARGET,
    NOT_MARKED,
    OPEN,
    QUEUED,
    THROTTLED,
    UNCHECKED,
    UNDER_REPLICATED,
    UNKNOWN,
    WRITER_ONLY,
    Blocker,
    CopyState,
    Explanation,
    FragmentState,
    LedgerFacts,
    span,
    when,
)
from aiobk.autorecovery.explain.probes import holders
from aiobk.autorecovery.fragments import (
    bookies_named,
    closed_fragments,
    open_fragment,
    slot_bounds,
)
from aiobk.autorecovery.spread import short_sets
from aiobk.client.placement import Spread
from aiobk.metadata import (
    PLACEMENT,
    LedgerMetadata,
    LedgerState,
    RepairAttempt,
    UnderReplication,
)
from aiobk.metadata.autorecovery import DEFERRED, FAILED, REPAIRING
from aiobk.protocol import DigestType

# ---------------------------------------------------------------------------------- the verdict


def explain(facts: LedgerFacts) -> Explanation:
    """The explanation of one ledger (see the module docstring)."""
    metadata, mark = facts.metadata, facts.mark
    if metadata is None:
        return _gone(facts)
    fragments = _fragment_states(facts, metadata)
    lost_ranges = mark.lost if mark is not None else ()
    blockers: list[Blocker] = []
    if mark is not None and mark.missing:
        status = UNDER_REPLICATED
        blockers = _marked_blockers(facts, metadata, mark, fragments)
        if PLACEMENT in mark.reasons:
            blockers.append(_placement(facts, metadata))
    elif mark is not None and PLACEMENT in mark.reasons and not mark.lost:
        status = UNDER_REPLICATED
        blockers = [_placement(facts, metadata)]
        blockers += _claimed(facts, facts.attempt) if facts.claimant is not None else []
    else:
        blockers = _unmarked_blockers(facts, metadata, fragments)
        status = AT_RISK if blockers else (LOST if lost_ranges else HEALTHY)
    if lost_ranges:
        blockers.append(
            Blocker(
                LOST_ENTRIES,
                f"entries {_ranges(lost_ranges)} have no copy left on any bookie: reported, "
                "never retried",
                (
                    "read what is left and write it elsewhere if it matters, then "
                    f"`aiobk ledger delete {facts.ledger_id}`",
                ),
            )
        )
    missing_now = any(
        c.state in (MISSING, LOST_BOOKIE) or c.draining for f in fragments for c in f.copies
    )
    under = (status == UNDER_REPLICATED and mark is not None and bool(mark.missing)) or missing_now
    summary = _summary(facts.ledger_id, status, metadata, fragments, blockers)
    return Explanation(
        facts.ledger_id,
        status,
        under,
        summary,
        str(metadata.state),
        mark,
        facts.claimant,
        facts.attempt,
        tuple(fragments),
        tuple(blockers),
        facts.probes is not None,
        facts.now_ms,
    )


def _gone(facts: LedgerFacts) -> Explanation:
    blockers: tuple[Blocker, ...] = ()
    summary = f"ledger {facts.ledger_id} does not exist (never created, or deleted)"
    if facts.mark is not None:
        blockers = (
            Blocker(
                NO_SUCH_LEDGER,
                "its mark outlived it: the next worker or full check drops the mark",
            ),
        )
        summary += "; a mark for it is left over"
    return Explanation(
        facts.ledger_id, GONE, False, summary, mark=facts.mark, blockers=blockers,
        attempt=facts.attempt, claimant=facts.claimant, now_ms=facts.now_ms,
    )  # fmt: skip


def _copy_state(facts: LedgerFacts, bookie: str, entries: list[int]) -> str:
    if bookie not in facts.registered:
        lost = facts.status is not None and bookie in facts.status.lost_bookies
        return LOST_BOOKIE if lost else ABSENT
    if facts.probes is None or not entries:
        return UNCHECKED
    answers = [facts.probes.get((bookie, entry)) for entry in entries]
    if Holding.MISSING in answers:
        return MISSING
    if any(a is None for a in answers):
        return UNCHECKED
    return UNKNOWN if Holding.UNKNOWN in answers else HELD


def _fragment_states(facts: LedgerFacts, metadata: LedgerMetadata) -> list[FragmentState]:
    e, wq = metadata.ensemble_size, metadata.write_quorum
    out: list[FragmentState] = []
    for index, fragment in enumerate(closed_fragments(metadata)):
        copies = []
        for slot, bookie in enumerate(fragment.ensemble):
            bounds = slot_bounds(fragment.first, fragment.last, slot, e, wq)
            entries = sorted(set(bounds)) if bounds is not None else []
            state = _copy_state(facts, bookie, entries)
            if index >= MAX_FRAGMENTS_CHECKED and state in (UNKNOWN, HELD, MISSING):
                state = UNCHECKED
            copies.append(CopyState(bookie, state, bookie in facts.draining))
        out.append(FragmentState(fragment.first, fragment.last, fragment.ensemble, tuple(copies)))
    tail = open_fragment(metadata)
    if tail is not None:
        copies = []
        for bookie in tail.ensemble:
            state = OPEN if bookie in facts.registered else _copy_state(facts, bookie, [])
            copies.append(CopyState(bookie, state, bookie in facts.draining))
        out.append(FragmentState(tail.first_entry_id, None, tail.ensemble, tuple(copies)))
    return out


def _marked_blockers(
    facts: LedgerFacts,
    metadata: LedgerMetadata,
    mark: UnderReplication,
    fragments: list[FragmentState],
) -> list[Blocker]:
    out: list[Blocker] = []
    now = facts.now_ms
    named = bookies_named(metadata)
    moving = {b for b in mark.missing if b not in facts.registered} | (facts.draining & named)
    if not facts.enabled:
        out.append(
            Blocker(
                DISABLED,
                "autorecovery is disabled cluster-wide: no worker takes a ledger",
                ("`aiobk autorecovery enable`",),
            )
        )
    attempt = facts.attempt
    if facts.claimant is None and facts.auditor is None:
        out.append(
            Blocker(
                NO_AUTORECOVERY,
                "no autorecovery process runs (no auditor is elected), so no worker takes it",
                (
                    "start bookies with autorecovery_enabled = true, or run "
                    "`aiobk autorecovery start`",
                ),
            )
        )
    tail = open_fragment(metadata)
    if tail is not None and (
        metadata.state is LedgerState.IN_RECOVERY or moving & set(tail.ensemble)
    ):
        out.append(_open_ledger(facts, metadata, mark))
    out.extend(_targets(facts, metadata, moving))
    out.extend(_sources(facts, metadata, mark, moving))
    # A worker on it comes after what stops it: a claim that will fail is no answer.
    if facts.claimant is not None:
        out.extend(_claimed(facts, attempt))
    back = [
        b
        for b in mark.missing
        if b in facts.registered and b not in facts.draining and _holds_all(b, fragments)
    ]
    if back:
        out.append(
            Blocker(
                BOOKIE_BACK,
                f"{', '.join(back)} registered again and holding its copies: the next worker "
                "drops it from the mark without copying",
            )
        )
    if attempt is not None and attempt.worker != facts.claimant:
        out.extend(_last_attempt(attempt, now, {b.kind for b in out}))
    if not out:
        poll = facts.setting("autorecovery_poll_interval")
        out.append(
            Blocker(
                QUEUED,
                f"waiting for a worker to take it (each idle worker looks every ~{poll:g}s)",
            )
        )
    return out


def _placement(facts: LedgerFacts, metadata: LedgerMetadata) -> Blocker:
    """Why the ledger is marked for its placement: its write sets on too few racks."""
    min_racks = int(facts.setting("min_racks_per_write_quorum"))
    spread = Spread(dict(facts.racks), min_racks)
    short = []
    for fragment in closed_fragments(metadata):
        for slots in short_sets(fragment.ensemble, metadata.write_quorum, spread):
            racks = sorted({spread.rack(fragment.ensemble[s]) for s in slots})
            short.append(f"entries {fragment.first}-{fragment.last}: {', '.join(racks)}")
    where = "; ".join(short[:3]) + (f"; and {len(short) - 3} more" if len(short) > 3 else "")
    return Blocker(
        MISPLACED,
        f"marked for its placement: write sets span fewer than min_racks_per_write_quorum="
        f"{min_racks} racks ({where or 'spread since the mark'}); a worker moves one copy of "
        "each such write set to another rack's bookie",
    )


def _holds_all(bookie: str, fragments: list[FragmentState]) -> bool:
    states = [c.state for f in fragments for c in f.copies if c.bookie == bookie]
    return bool(states) and all(s == HELD for s in states)


def _claimed(facts: LedgerFacts, attempt: RepairAttempt | None) -> list[Blocker]:
    worker = facts.claimant
    current = attempt if attempt is not None and attempt.worker == worker else None
    if current is None:
        return [Blocker(CLAIMED, f"being repaired by worker {worker}")]
    progress = ""
    if current.entries_to_copy:
        progress = f": {current.entries_copied} of {current.entries_to_copy} entries copied"
    elif current.entries_copied:
        progress = f": {current.entries_copied} entries copied"
    before = f" (the attempt before stopped: {current.detail})" if current.detail else ""
    out = [
        Blocker(
            CLAIMED,
            f"being repaired by worker {worker} since {when(current.started, facts.now_ms)}"
            + progress
            + before,
        )
    ]
    rate = current.max_bytes_per_second
    if rate > 0:
        left = max(0, current.entries_to_copy - current.entries_copied)
        per_entry = current.bytes_copied / current.entries_copied if current.entries_copied else 0
        eta = ""
        if left and per_entry:
            eta = f"; about {span(left * per_entry / rate)} more at that rate"
        out.append(
            Blocker(
                THROTTLED,
                f"copying is capped at {rate} bytes/s (rereplication_max_bytes_per_second)" + eta,
                ("raise rereplication_max_bytes_per_second (0: no cap) and restart the workers",),
            )
        )
    return out


def _open_ledger(facts: LedgerFacts, metadata: LedgerMetadata, mark: UnderReplication) -> Blocker:
    ledger_id = facts.ledger_id
    if metadata.digest_type is DigestType.MAC:
        return Blocker(
            WRITER_ONLY,
            "the ledger is open and its digest is a MAC: only its writer, who has the "
            "password, can close it, and its last fragment is left to it",
            (
                "let the writer close the ledger, or close it yourself: "
                f"`aiobk ledger recover {ledger_id} --password PASSWORD`",
            ),
        )
    grace = facts.setting("open_ledger_rereplication_grace_period")
    until = mark.since + int(grace * 1000)
    if facts.now_ms < until:
        return Blocker(
            GRACE,
            f"the ledger is open and its writer's fragment names a bookie to replace: its "
            f"writer usually does that itself, so workers wait out "
            f"open_ledger_rereplication_grace_period ({grace:g}s) until "
            f"{when(until, facts.now_ms)}, then fence and close it",
            (
                f"wait, or close it now: `aiobk ledger recover {ledger_id}` (with --password if "
                "it has one)",
            ),
            until,
        )
    return Blocker(
        GRACE,
        "the ledger is open and its grace period has passed: the next worker fences and "
        "closes it, then copies",
        (f"or close it now: `aiobk ledger recover {ledger_id}` (with --password if it has one)",),
        until,
    )


def _targets(facts: LedgerFacts, metadata: LedgerMetadata, moving: set[str]) -> list[Blocker]:
    out: list[Blocker] = []
    for fragment in closed_fragments(metadata):
        leaving = [b for b in fragment.ensemble if b in moving]
        if not leaving:
            continue
        free = facts.writable - set(fragment.ensemble) - moving
        if free:
            continue
        writable = ", ".join(sorted(facts.writable)) or "none"
        read_only = sorted(facts.registered - facts.writable - set(fragment.ensemble))
        actions = ["add a bookie (a copy of an entry per bookie: one outside the ensemble)"]
        if read_only:
            actions.append(f"make a read-only bookie writable ({', '.join(read_only)})")
        absent = [b for b in leaving if b not in facts.registered]
        if absent:
            actions.append(f"bring back {', '.join(absent)} with its data")
        out.append(
            Blocker(
                NO_TARGET,
                f"no writable bookie outside the ensemble of entries {fragment.first}-"
                f"{fragment.last} ({', '.join(fragment.ensemble)}) can take the copies of "
                f"{', '.join(leaving)} (writable: {writable})",
                tuple(actions),
            )
        )
    return out


def _sources(
    facts: LedgerFacts, metadata: LedgerMetadata, mark: UnderReplication, moving: set[str]
) -> list[Blocker]:
    """For each copy to make, whether some other bookie of its entries' write sets has them
    (judged on the first and last entry each copy owes)."""
    lost_bookies = facts.status.lost_bookies if facts.status is not None else {}
    e, wq = metadata.ensemble_size, metadata.write_quorum
    no_source: list[str] = []
    waiting: dict[str, None] = {}
    for fragment in closed_fragments(metadata)[:MAX_FRAGMENTS_CHECKED]:
        for slot, bookie in enumerate(fragment.ensemble):
            bounds = slot_bounds(fragment.first, fragment.last, slot, e, wq)
            if bounds is None:
                continue
            entries = sorted(set(bounds))
            if bookie not in moving:
                if bookie not in mark.missing or facts.probes is None:
                    continue
                # A registered bookie lacking entries gets them back (a fill).
                entries = [n for n in entries if facts.probes.get((bookie, n)) is Holding.MISSING]
            for entry in entries:
                if any(lo <= entry <= hi for lo, hi in mark.lost):
                    continue
                others = [h for h in holders(entry, fragment, metadata) if h != bookie]
                if bookie in moving and bookie in facts.registered:
                    others.append(bookie)  # a draining bookie is a source while it lives
                verdict = _source_verdict(facts, others, entry, lost_bookies)
                if verdict == NO_SOURCE:
                    no_source.append(f"entry {entry} (of {bookie})")
                elif verdict == BOOKIE_ABSENT:
                    for h in others:
                        if h not in facts.registered and h not in lost_bookies:
                            waiting.setdefault(h, None)
    out: list[Blocker] = []
    if waiting:
        delay = facts.setting("lost_bookie_recovery_delay")
        names = ", ".join(waiting)
        out.append(
            Blocker(
                BOOKIE_ABSENT,
                f"some entries' only other copies are on {names}, which is down but not yet "
                f"lost: the copy waits for it to return, or for the auditor to call it lost "
                f"(lost_bookie_recovery_delay, {delay:g}s) and report what no one has",
                (
                    f"bring {names} back",
                    "or, if it is gone for good, "
                    f"`aiobk bookies decommission {next(iter(waiting))}`",
                ),
            )
        )
    if no_source:
        shown = "; ".join(no_source[:5]) + (" ..." if len(no_source) > 5 else "")
        out.append(
            Blocker(
                NO_SOURCE,
                f"no bookie holds a readable copy of {shown}: every bookie of its write set is "
                "lost or answered that it has none; the worker reports such entries lost",
                ("if a lost bookie's disk survives, start it again: its copies are read back",),
            )
        )
    return out


def _source_verdict(
    facts: LedgerFacts, others: list[str], entry: int, lost_bookies: Mapping[str, int]
) -> str:
    """HELD when some source answered it has the entry (or was not asked), NO_SOURCE when
    every source is lost or said it has none, BOOKIE_ABSENT when the rest are down for now,
    UNKNOWN when some could not answer."""
    verdicts = []
    for holder in others:
        if holder not in facts.registered:
            verdicts.append(NO_SOURCE if holder in lost_bookies else BOOKIE_ABSENT)
            continue
        answer = None if facts.probes is None else facts.probes.get((holder, entry))
        if answer is None or answer is Holding.HELD:
            return HELD
        verdicts.append(NO_SOURCE if answer is Holding.MISSING else UNKNOWN)
    if UNKNOWN in verdicts:
        return UNKNOWN
    if BOOKIE_ABSENT in verdicts:
        return BOOKIE_ABSENT
    return NO_SOURCE


def _last_attempt(attempt: RepairAttempt, now: int, known: set[str]) -> list[Blocker]:
    """What the last worker to try it said (when no worker holds it now)."""
    if attempt.state == REPAIRING:
        return []  # its worker released it without a verdict (stopped mid-way)
    retry = ""
    if attempt.retry_at > now:
        retry = f"; it tries again after {when(attempt.retry_at, now)}"
    what = "failed" if attempt.state == FAILED else "was put off"
    tries = f" ({attempt.failures} failures in a row)" if attempt.failures > 1 else ""
    message = (
        f"the last attempt, by worker {attempt.worker} at {when(attempt.updated, now)}, {what}"
        f"{tries}: {attempt.detail or attempt.kind}{retry}"
    )
    kind = BACKOFF if attempt.state == FAILED else DEFERRED
    actions: tuple[str, ...] = ()
    if attempt.kind in (NO_TARGET, NO_SOURCE, BOOKIE_ABSENT) and attempt.kind in known:
        actions = ()  # the blocker found above says what to do
    elif attempt.state == FAILED:
        actions = ("see the worker's log for the full error",)
    until = attempt.retry_at if attempt.retry_at > now else None
    return [Blocker(kind, message, actions, until)]


def _unmarked_blockers(
    facts: LedgerFacts, metadata: LedgerMetadata, fragments: list[FragmentState]
) -> list[Blocker]:
    out: list[Blocker] = []
    lost_bookies = facts.status.lost_bookies if facts.status is not None else {}
    absent_since = facts.status.missing_bookies if facts.status is not None else {}
    delay = facts.setting("lost_bookie_recovery_delay")
    gone = sorted(b for b in bookies_named(metadata) if b not in facts.registered)
    for bookie in gone:
        if facts.auditor is None:
            out.append(
                Blocker(
                    NO_AUTORECOVERY,
                    f"{bookie} is not registered and no autorecovery process runs (no "
                    "auditor is elected), so nobody will mark the ledger",
                    (
                        "start bookies with autorecovery_enabled = true, or run "
                        "`aiobk autorecovery start`",
                    ),
                )
            )
        elif bookie in lost_bookies:
            out.append(
                Blocker(
                    NOT_MARKED,
                    f"{bookie} is lost: the auditor marks the ledger on its next bookie check",
                    ("`aiobk autorecovery trigger-audit` to check now",),
                )
            )
        else:
            since = absent_since.get(bookie)
            until = since + int(delay * 1000) if since else None
            at = f" until {when(until, facts.now_ms)}" if until is not None else ""
            out.append(
                Blocker(
                    NOT_MARKED,
                    f"{bookie} is down: the auditor waits lost_bookie_recovery_delay "
                    f"({delay:g}s){at} before it calls it lost and marks the ledger",
                    (
                        f"bring {bookie} back, or `aiobk bookies decommission {bookie}` if it is "
                        "gone for good",
                    ),
                    until,
                )
            )
    lacking = sorted({c.bookie for f in fragments for c in f.copies if c.state == MISSING})
    if lacking:
        out.append(
            Blocker(
                NOT_MARKED,
                f"{', '.join(lacking)} lacks copies it should hold: the auditor's periodic "
                "check marks the ledger",
                ("`aiobk autorecovery trigger-audit` to check now",),
            )
        )
    draining = sorted(facts.draining & bookies_named(metadata))
    if draining:
        out.append(
            Blocker(
                NOT_MARKED,
                f"{', '.join(draining)} is being decommissioned and this ledger is not marked "
                "yet: the decommission marks it",
                (f"run `aiobk bookies decommission {draining[0]}` again",),
            )
        )
    return out


def _summary(
    ledger_id: int,
    status: str,
    metadata: LedgerMetadata,
    fragments: list[FragmentState],
    blockers: list[Blocker],
) -> str:
    state = str(metadata.state).lower().replace("_", " ")
    missing = sorted({b for f in fragments for b in f.missing})
    where = [f for f in fragments if f.missing]
    copies = (
        f"copies of {', '.join(missing)} missing or leaving in {len(where)} fragment(s)"
        if missing
        else "no copy found missing"
    )
    head = {
        HEALTHY: f"ledger {ledger_id} ({state}) is fully replicated",
        UNDER_REPLICATED: f"ledger {ledger_id} ({state}) is under-replicated: {copies}",
        LOST: f"ledger {ledger_id} ({state}) has lost entries",
        AT_RISK: f"ledger {ledger_id} ({state}) is not marked for repair: {copies}",
    }[status]
    if status == UNDER_REPLICATED and not missing and blockers and blockers[0].kind == MISPLACED:
        return f"ledger {ledger_id} ({state}) is marked for its placement; {blockers[0].message}"
    if status == HEALTHY:
        return head
    return f"{head}; {blockers[0].message}" if blockers else head


def _ranges(ranges: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
