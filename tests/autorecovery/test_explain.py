"""The verdict of ``aiobk autorecovery explain`` (``aiobk.autorecovery.explain.decide``), pure:
facts written by hand, no store, no socket."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from aiobk.autorecovery.checker import Holding
from aiobk.autorecovery.explain import LedgerFacts, explain, probe_plan
from aiobk.autorecovery.explain import model as m
from aiobk.metadata import (
    CHECK,
    LOST_BOOKIE,
    AuditorStatus,
    Fragment,
    LedgerMetadata,
    LedgerState,
    RepairAttempt,
    UnderReplication,
)
from aiobk.metadata.autorecovery import DEFERRED, FAILED
from aiobk.protocol import DigestType

A, B, C, D = "a:1", "b:1", "c:1", "d:1"
NOW = 1_000_000


def closed(ensemble: tuple[str, ...] = (A, B, C), last: int = 9, **shape: int) -> LedgerMetadata:
    e = shape.get("e", len(ensemble))
    metadata = LedgerMetadata(e, shape.get("wq", e), shape.get("aq", 2), (Fragment(0, ensemble),))
    return metadata.closed(last, 100)


def held(
    metadata: LedgerMetadata, *, missing: tuple[str, ...] = ()
) -> dict[tuple[str, int], Holding]:
    """Every planned probe answered: HELD, or MISSING for the bookies in ``missing``."""
    everyone = frozenset(b for f in metadata.fragments for b in f.ensemble)
    return {
        (bookie, entry): Holding.MISSING if bookie in missing else Holding.HELD
        for bookie, entry in probe_plan(metadata, everyone)
    }


def facts(metadata: LedgerMetadata | None, **given: object) -> LedgerFacts:
    base: dict[str, object] = {
        "auditor": A,
        "registered": frozenset({A, B, C, D}),
        "writable": frozenset({A, B, C, D}),
    }
    return LedgerFacts(7, NOW, metadata, **{**base, **given})  # type: ignore[arg-type]


def mark(*missing: str, reason: str = LOST_BOOKIE, since: int = NOW - 60_000) -> UnderReplication:
    return UnderReplication(7, tuple(sorted(missing)), since, (reason,))


def kinds(facts_: LedgerFacts) -> list[str]:
    return [b.kind for b in explain(facts_).blockers]


def test_a_ledger_whose_copies_are_all_held_is_healthy() -> None:
    metadata = closed()
    explanation = explain(facts(metadata, probes=held(metadata)))
    assert explanation.status == m.HEALTHY
    assert not explanation.under_replicated
    assert explanation.blockers == ()
    assert explanation.summary == "ledger 7 (closed) is fully replicated"
    assert [c.state for c in explanation.fragments[0].copies] == [m.HELD] * 3
    json.dumps(explanation.to_document())


def test_no_bookie_outside_the_ensemble_holds_the_repair_and_says_what_to_do() -> None:
    metadata = closed()
    three = frozenset({B, C})  # A lost, and only the ensemble's other two are left
    status = AuditorStatus(A, {A: NOW - 120_000})
    found = explain(facts(metadata, mark=mark(A), registered=three, writable=three, status=status))
    assert found.status == m.UNDER_REPLICATED
    assert found.under_replicated
    assert found.blockers[0].kind == m.NO_TARGET
    assert "no writable bookie outside the ensemble of entries 0-9" in found.blockers[0].message
    assert "add a bookie (a copy of an entry per bookie: one outside the ensemble)" in found.actions
    assert found.fragments[0].missing == (A,)
    assert {c.bookie: c.state for c in found.fragments[0].copies}[A] == m.LOST_BOOKIE
    assert "no writable bookie outside the ensemble" in found.summary


def test_a_read_only_bookie_outside_the_ensemble_is_named_as_the_way_out() -> None:
    metadata = closed()
    found = explain(
        facts(metadata, mark=mark(A), registered=frozenset({B, C, D}), writable=frozenset({B, C}))
    )
    assert found.blockers[0].kind == m.NO_TARGET
    assert f"make a read-only bookie writable ({D})" in found.actions


def test_no_readable_source_when_every_other_copy_is_lost_or_absent() -> None:
    metadata = closed((A, B), e=2, wq=2, aq=2)
    status = AuditorStatus(C, {A: 1, B: 2})
    lost = explain(
        facts(metadata, mark=mark(A, B), registered=frozenset({C, D}), status=status, probes={})
    )
    assert m.NO_SOURCE in [b.kind for b in lost.blockers]
    # B only down, not lost: the copy waits for it.
    status = AuditorStatus(C, {A: 1}, {B: NOW - 1_000})
    waiting = explain(
        facts(metadata, mark=mark(A), registered=frozenset({C, D}), status=status, probes={})
    )
    blocker = next(b for b in waiting.blockers if b.kind == m.BOOKIE_ABSENT)
    assert f"only other copies are on {B}" in blocker.message
    assert f"bring {B} back" in blocker.actions


def test_a_source_that_answers_no_such_entry_is_no_source() -> None:
    metadata = closed((A, B), e=2, wq=2, aq=2)
    probes = held(metadata, missing=(B,))
    found = explain(facts(metadata, mark=mark(A), registered=frozenset({B, C}), probes=probes))
    assert m.NO_SOURCE in [b.kind for b in found.blockers]


def test_a_claimed_ledger_shows_its_worker_progress_and_throttle() -> None:
    metadata = closed()
    attempt = RepairAttempt(
        7, "w1", NOW - 30_000, updated=NOW - 1_000, entries_to_copy=100, entries_copied=40,
        bytes_copied=40_000, max_bytes_per_second=1_000,
    )  # fmt: skip
    found = explain(
        facts(metadata, mark=mark(A), registered=frozenset({B, C, D}), claimant="w1",
              attempt=attempt)
    )  # fmt: skip
    assert [b.kind for b in found.blockers][:2] == [m.CLAIMED, m.THROTTLED]
    claimed, throttled = found.blockers[:2]
    assert "being repaired by worker w1 since" in claimed.message
    assert "30s ago: 40 of 100 entries copied" in claimed.message
    assert "capped at 1000 bytes/s" in throttled.message
    assert "about 1m more at that rate" in throttled.message  # 60 entries of 1000 bytes


def test_an_open_ledger_waits_out_the_grace_period_published_by_the_auditor() -> None:
    open_ledger = LedgerMetadata(3, 3, 2, (Fragment(0, (A, B, C)),))
    status = AuditorStatus(D, settings={"open_ledger_rereplication_grace_period": 300.0})
    found = explain(
        facts(open_ledger, mark=mark(A, since=NOW - 60_000), registered=frozenset({B, C, D}),
              status=status)
    )  # fmt: skip
    grace = next(b for b in found.blockers if b.kind == m.GRACE)
    assert grace.until == NOW + 240_000
    assert "(300s) until" in grace.message
    assert "4m from now" in grace.message
    assert found.fragments[-1].last is None
    over = dataclasses.replace(
        facts(open_ledger, mark=mark(A), registered=frozenset({B, C, D}), status=status),
        now_ms=NOW + 600_000,
    )
    grace = next(b for b in explain(over).blockers if b.kind == m.GRACE)
    assert "its grace period has passed: the next worker fences and closes it" in grace.message


def test_an_open_ledger_with_a_mac_digest_is_left_to_its_writer() -> None:
    mac = dataclasses.replace(
        LedgerMetadata(3, 3, 2, (Fragment(0, (A, B, C)),)), digest_type=DigestType.MAC
    )
    found = explain(facts(mac, mark=mark(A), registered=frozenset({B, C, D})))
    assert m.WRITER_ONLY in [b.kind for b in found.blockers]
    assert any("--password" in a for a in found.actions)


def test_disabled_and_no_autorecovery_come_first() -> None:
    metadata = closed()
    base = facts(metadata, mark=mark(A), registered=frozenset({B, C, D}))
    assert kinds(dataclasses.replace(base, enabled=False))[0] == m.DISABLED
    assert kinds(dataclasses.replace(base, auditor=None))[0] == m.NO_AUTORECOVERY
    assert (
        "`aiobk autorecovery enable`" in explain(dataclasses.replace(base, enabled=False)).actions
    )


def test_the_last_failed_attempt_says_when_it_is_tried_again() -> None:
    metadata = closed()
    attempt = RepairAttempt(
        7, "w2", NOW - 10_000, FAILED, "error", "writing entry 3 to d:1: timed out",
        failures=3, retry_at=NOW + 20_000, updated=NOW - 5_000,
    )  # fmt: skip
    found = explain(facts(metadata, mark=mark(A), registered=frozenset({B, C, D}), attempt=attempt))
    backoff = next(b for b in found.blockers if b.kind == m.BACKOFF)
    assert backoff.until == NOW + 20_000
    assert "by worker w2" in backoff.message
    assert "(3 failures in a row)" in backoff.message
    assert "writing entry 3 to d:1: timed out; it tries again after" in backoff.message
    deferred = dataclasses.replace(attempt, state=DEFERRED, kind=m.GRACE, detail="open")
    found = explain(facts(metadata, mark=mark(A), registered=frozenset({B, C, D}),
                          attempt=deferred))  # fmt: skip
    assert "was put off" in next(b for b in found.blockers if b.kind == DEFERRED).message


def test_a_marked_ledger_nothing_holds_waits_for_a_worker() -> None:
    metadata = closed()
    found = explain(facts(metadata, mark=mark(A), registered=frozenset({B, C, D})))
    assert kinds(facts(metadata, mark=mark(A), registered=frozenset({B, C, D}))) == [m.QUEUED]
    assert found.reason.startswith("waiting for a worker to take it")


def test_a_bookie_that_came_back_with_its_copies_is_dropped_without_copying() -> None:
    metadata = closed()
    found = explain(facts(metadata, mark=mark(A, reason=CHECK), probes=held(metadata)))
    assert kinds(facts(metadata, mark=mark(A, reason=CHECK), probes=held(metadata))) == [
        m.BOOKIE_BACK
    ]
    assert found.blockers[0].message.startswith(f"{A} registered again and holding its copies")


def test_an_absent_bookie_not_yet_lost_is_explained_with_the_time_it_will_be() -> None:
    metadata = closed()
    status = AuditorStatus(D, {}, {A: NOW - 10_000}, settings={"lost_bookie_recovery_delay": 60.0})
    found = explain(facts(metadata, registered=frozenset({B, C, D}), status=status))
    assert found.status == m.AT_RISK
    assert not found.under_replicated  # down is not lost
    assert found.blockers[0].kind == m.NOT_MARKED
    assert found.blockers[0].until == NOW + 50_000
    assert "waits lost_bookie_recovery_delay (60s)" in found.blockers[0].message


def test_copies_missing_on_a_registered_bookie_before_any_check_marked_them() -> None:
    metadata = closed()
    found = explain(facts(metadata, probes=held(metadata, missing=(B,))))
    assert found.status == m.AT_RISK
    assert found.under_replicated
    assert "trigger-audit" in found.actions[0]
    assert found.fragments[0].missing == (B,)


def test_entries_reported_lost_are_said_and_not_retried() -> None:
    metadata = closed()
    report = dataclasses.replace(mark(A), missing=()).with_lost([(3, 5)])
    found = explain(facts(metadata, mark=report, probes=held(metadata)))
    assert found.status == m.LOST
    assert found.blockers[-1].kind == m.LOST_ENTRIES
    assert "entries 3-5 have no copy left on any bookie" in found.blockers[-1].message
    assert found.summary.startswith("ledger 7 (closed) has lost entries")


def test_a_deleted_ledger_and_its_left_over_mark() -> None:
    gone = explain(facts(None, mark=mark(A)))
    assert gone.status == m.GONE
    assert not gone.under_replicated
    assert "a mark for it is left over" in gone.summary
    assert explain(facts(None)).blockers == ()


def test_the_probe_plan_asks_each_copy_and_the_sources_of_an_unregistered_one() -> None:
    metadata = closed((A, B, C), e=3, wq=2)
    plan = probe_plan(metadata, frozenset({B, C}))
    # With E=3, WQ=2: B owes 0-9 (first 0, last 9), C owes 1-8; A is not registered, and its
    # first and last (0 and 9, each on slots 0 and 1) are asked of B, their other holder.
    assert sorted(plan) == [(B, 0), (B, 9), (C, 1), (C, 8)]
    assert all(bookie != A for bookie, _entry in plan)
    assert len(plan) == len(set(plan))


def test_the_text_names_the_fragments_the_holds_and_the_actions() -> None:
    metadata = closed()
    lines = explain(
        facts(metadata, mark=mark(A), registered=frozenset({B, C}), writable=frozenset({B, C}))
    ).lines()
    assert lines[0].startswith("ledger 7 (closed) is under-replicated: copies of a:1 missing")
    assert "fragments:" in lines
    assert "  entries 0-9: a:1 absent-bookie, b:1 unchecked, c:1 unchecked" in lines
    assert "what holds it:" in lines
    assert "what you can do:" in lines


bookie_sets = st.frozensets(st.sampled_from([A, B, C, D]))


@settings(max_examples=200, deadline=None)
@given(
    registered=bookie_sets,
    writable=bookie_sets,
    draining=bookie_sets,
    missing=bookie_sets,
    state=st.sampled_from(list(LedgerState)),
    answers=st.lists(st.sampled_from(list(Holding)), min_size=0, max_size=40),
    enabled=st.booleans(),
    claimed=st.booleans(),
)
def test_every_fact_pattern_gets_a_verdict_with_a_reason(
    registered: frozenset[str],
    writable: frozenset[str],
    draining: frozenset[str],
    missing: frozenset[str],
    state: LedgerState,
    answers: list[Holding],
    enabled: bool,
    claimed: bool,
) -> None:
    metadata = LedgerMetadata(3, 2, 2, (Fragment(0, (A, B, C)), Fragment(5, (A, B, D))))
    if state is LedgerState.CLOSED:
        metadata = metadata.closed(11, 100)
    else:
        metadata = dataclasses.replace(metadata, state=state)
    plan = probe_plan(metadata, registered)
    probes = dict(zip(plan, answers, strict=False))
    found = explain(
        facts(
            metadata,
            mark=mark(*missing) if missing else None,
            registered=registered,
            writable=writable & registered,
            draining=draining,
            probes=probes,
            enabled=enabled,
            claimant="w" if claimed else None,
        )
    )
    assert found.status in (m.HEALTHY, m.UNDER_REPLICATED, m.AT_RISK)
    assert (found.status == m.HEALTHY) == (not found.blockers)
    if missing:
        assert found.status == m.UNDER_REPLICATED
        assert found.blockers
    json.dumps(found.to_document())
    assert found.lines()[0] == found.summary
