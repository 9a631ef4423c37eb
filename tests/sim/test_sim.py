"""The simulator in `make test`: a clean campaign of at least 300 seeds, a campaign of the loss
profile (bookies lost for good, autorecovery in the bookies: I15) and of the offload profile
(I18, I19), exact replay, and a checker that is shown to catch what it looks for."""

from __future__ import annotations

import dataclasses
import os

import pytest

import aiobk.bookie.gc as bookie_gc
from aiobk.autorecovery import offload_pass
from aiobk.client import LogPosition
from aiobk.client.log.position import LogRecord
from aiobk.client.offload import upkeep
from aiobk.metadata import Fragment, LedgerMetadata, LedgerState
from tests.sim.checker import _check_ledger, _check_log_order
from tests.sim.history import Append, History, LogAppend, ProducerAppend
from tests.sim.racks import best_spread, short_of_racks
from tests.sim.run import SimOptions, run_seed, run_seeds
from tests.sim.sequences import check_producers
from tests.sim.world import Switches

CHUNK = 50
CHUNKS = 4  # 200 seeds here (the suite's time is a budget); make sim runs campaigns of any length


def _failures(results: list) -> str:  # type: ignore[type-arg]
    hint = "" if os.environ.get("PYTHONHASHSEED") == "0" else " (run under PYTHONHASHSEED=0)"
    return "\n\n".join(r.report() for r in results[:2]) + hint


@pytest.mark.timeout(240)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_campaign_holds_every_invariant(chunk: int) -> None:
    results = list(run_seeds(range(chunk * CHUNK, (chunk + 1) * CHUNK)))
    failed = [r for r in results if not r.ok]
    assert not failed, _failures(failed)
    assert sum(r.acknowledged for r in results) > 1000 * CHUNK // 10
    assert sum(sum(r.faults.values()) for r in results) > CHUNK  # faults really happened


# Two bookies lost for good per run while the writers go on, with the other I15
# faults (tests.sim.loss); about 1.5 s of CPU a seed.
LOSS_CHUNK = 20
LOSS_CHUNKS = 2


@pytest.mark.timeout(240)
@pytest.mark.parametrize("chunk", range(LOSS_CHUNKS))
def test_loss_campaign_restores_every_copy(chunk: int) -> None:
    seeds = range(chunk * LOSS_CHUNK, (chunk + 1) * LOSS_CHUNK)
    results = list(run_seeds(seeds, SimOptions(profile="loss")))
    failed = [r for r in results if not r.ok]
    assert not failed, _failures(failed)
    assert sum(r.repairs["lost_bookies"] == 2 for r in results) >= 0.9 * LOSS_CHUNK  # both
    assert sum(r.repairs["fragments"] for r in results) > 5 * LOSS_CHUNK  # copies really moved
    assert sum(r.acknowledged for r in results) > 300 * LOSS_CHUNK


# The run's log offloaded while it is written, read and truncated: the object store failing,
# stalling, tearing uploads and going away, the auditor crashed mid-offload (tests.sim.offload;
# I18 and I19); about 1.5 s of CPU a seed.
OFFLOAD_SEEDS = 16


@pytest.mark.timeout(240)
def test_offload_campaign_holds_every_invariant() -> None:
    results = list(run_seeds(range(OFFLOAD_SEEDS), SimOptions(profile="offload")))
    failed = [r for r in results if not r.ok]
    assert not failed, _failures(failed)
    assert sum(r.offload.get("released", 0) for r in results) > 5 * OFFLOAD_SEEDS
    store_faults = ("failed", "stalled", "torn", "refused")
    assert sum(r.offload.get(kind, 0) for r in results for kind in store_faults) > OFFLOAD_SEEDS
    assert sum(r.faults.get("crash_offloader", 0) for r in results) > OFFLOAD_SEEDS // 4


def test_checker_catches_a_release_before_the_deletion_lag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The auditor's upkeep releasing copied ledgers at once, whatever the store's deletion
    lag: I18 must see a ledger released before its lag passed."""

    async def hasty(ctx, objects, settings, **kwargs):  # type: ignore[no-untyped-def]
        if settings is not None:
            settings = dataclasses.replace(settings, deletion_lag=0.0)
        return await upkeep(ctx, objects, settings, **kwargs)

    monkeypatch.setattr(offload_pass, "upkeep", hasty)
    for seed in range(12):
        result = run_seed(seed, SimOptions(profile="offload"))
        if not result.ok:
            assert any("before the deletion lag" in v for v in result.violations), result.report()
            return
    pytest.fail("releases before the deletion lag went unnoticed for 12 seeds")


def test_a_loss_seed_replays_exactly() -> None:
    first = run_seed(3, SimOptions(profile="worker_race"))
    # The second run's objects land elsewhere in memory: anything ordered by address (a set of
    # objects iterated -- a crash resetting its connections, tasks cancelled, watches told)
    # would order events differently and show as another trace.
    ballast = [bytearray(size % 700 + 1) for size in range(20_000)]
    second = run_seed(3, SimOptions(profile="worker_race"))
    del ballast
    assert first.trace == second.trace
    assert (first.acknowledged, first.repairs) == (second.acknowledged, second.repairs)


def test_an_offload_seed_replays_exactly() -> None:
    """The simulated object store's latencies and faults come from the seed too."""
    first = run_seed(5, SimOptions(profile="offload"))
    ballast = [bytearray(size % 700 + 1) for size in range(20_000)]  # as below
    second = run_seed(5, SimOptions(profile="offload"))
    del ballast
    assert first.trace == second.trace
    assert (first.offload, first.faults) == (second.offload, second.faults)


def test_a_seed_replays_exactly() -> None:
    first = run_seed(17, SimOptions(profile="race"))
    ballast = [bytearray(size % 700 + 1) for size in range(20_000)]  # as above
    second = run_seed(17, SimOptions(profile="race"))
    del ballast
    assert first.trace == second.trace
    assert (first.acknowledged, first.faults) == (second.acknowledged, second.faults)
    assert len(first.trace) > 10
    (elsewhere, _other) = run_seeds([17, 18], SimOptions(profile="race"), workers=2)
    assert elsewhere.trace == first.trace  # a worker process runs the same seed the same way


def test_checker_flags_lost_and_phantom_writes() -> None:
    history = History()
    history.appends = [
        Append(1, b"a", 0.0, "ok", 0),
        Append(1, b"b", 0.0, "ok", 1),
        Append(1, b"c", 0.0, "ok", 2),  # acknowledged, but the ledger closed at 1
        Append(1, b"d", 0.0, "unknown"),
    ]
    _check_ledger(history, 1, 1, {0: b"a", 1: b"x"})
    kinds = sorted(v.split()[0] for v in history.violations)
    assert kinds == ["I1", "I14", "I2"], history.violations


def test_checker_flags_log_appends_out_of_call_order() -> None:
    """One writer's appends must hold positions in call order, also across a roll; another
    writer's are judged on their own."""
    history = History()
    history.log_appends = [
        LogAppend("w1", b"a", "ok", (5, 0)),
        LogAppend("w1", b"b", "ok", (5, 1)),
        LogAppend("w2", b"x", "ok", (4, 9)),  # another writer: not compared with w1's
        LogAppend("w1", b"c", "unknown"),
        LogAppend("w1", b"d", "ok", (9, 1)),  # called before e, but after it in the log
        LogAppend("w1", b"e", "ok", (9, 0)),
    ]
    _check_log_order(history)
    (violation,) = history.violations
    assert violation.startswith("I14 log: w1 called b'd' before b'e'"), violation


def _produced(producer: str, sequence: int, position: tuple[int, int]) -> LogRecord:
    return LogRecord(
        LogPosition(*position), f"{producer}:{sequence}".encode(), None, {}, 0, producer, sequence
    )


def test_checker_flags_each_producer_anomaly() -> None:
    """I17 over a producer log: p1 holds 0 twice, lacks 2 (acknowledged) below 4, and has 4
    before 3 -- at another position than acknowledged; p2's acknowledged 1 (None: already
    in) and 2 are missing; a record nobody sent is there. An unknown append may be missing."""
    history = History()
    history.producer_appends = [
        ProducerAppend("p1", "L", s, f"p1:{s}".encode(), "n", "ok", (1, s)) for s in range(5)
    ]
    history.producer_appends += [
        ProducerAppend("p2", "L", 0, b"p2:0", "n", "ok", (1, 9)),
        ProducerAppend("p2", "L", 1, b"p2:1", "n", "dup"),
        ProducerAppend("p2", "L", 2, b"p2:2", "n", "ok", (2, 5)),
        ProducerAppend("p2", "L", 3, b"p2:3", "n", "unknown"),
    ]
    held = [("p1", 0), ("p1", 1), ("p1", 4), ("p1", 3), ("p1", 0)]
    found = {(1, i): _produced(p, s, (1, i)) for i, (p, s) in enumerate(held)}
    found[(1, 9)] = _produced("p2", 0, (1, 9))
    found[(2, 0)] = _produced("p3", 0, (2, 0))
    check_producers(history, "L", found)
    assert all(v.startswith("I17 log L: ") for v in history.violations), history.violations
    assert sorted(v.split(": ", 1)[1] for v in history.violations) == [
        "b'p3:0' at (2, 0) (producer p3, sequence 0) was never sent as that",
        "p1 has sequences 0 more than once (sequence 0 at [(1, 0), (1, 4)])",
        "p1 lacks sequences 2, below 4 which it holds",
        "p1 sequence 4 was acknowledged at (1, 4) but is at [(1, 2)]",
        "p1 sequences 2 were acknowledged but are not in the log",
        "p1 sequences out of order 1 time(s): 4 at (1, 2), then 3 at (1, 3)",
        "p2 sequences 1-2 were acknowledged but are not in the log",
    ], history.violations


def test_checker_flags_a_refused_append_that_shows_up() -> None:
    history = History()
    history.appends = [
        Append(1, b"a", 0.0, "ok", 0),
        Append(1, b"b", 0.0, "fail"),  # refused before it was sent
        Append(1, b"c", 0.0, "unknown", 1),  # sent, then failed: may be there
    ]
    _check_ledger(history, 1, 2, {0: b"a", 1: b"c", 2: b"b"})
    (violation,) = history.violations
    assert violation.startswith("I14"), violation
    assert "failed before it was sent" in violation, violation


@pytest.mark.parametrize("lossy", [False, True], ids=["nothing-lost", "a-crash"])
def test_checker_holds_a_writer_closed_volatile_ledger_to_every_ack(lossy: bool) -> None:
    """Entries 0..2 acknowledged, none under a LAC anyone saw, and the writer closed the
    volatile ledger at 0. Without a fault that can lose unsynced data that is a lost
    acknowledged entry (close-to-open); after a crash it is BP-14's trade."""
    history = History()
    history.volatile.add(1)
    history.writer_closed.add(1)
    history.unsynced_loss = lossy
    history.appends = [Append(1, b"%d" % i, 0.0, "ok", i) for i in range(3)]
    _check_ledger(history, 1, 0, {0: b"0"})
    if lossy:
        assert history.violations == []
    else:
        assert [v.split(":")[0] for v in history.violations] == ["I1 ledger 1"] * 2


def test_checker_catches_a_gc_that_removes_live_entry_logs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Garbage collection runs in every simulated bookie; one that removed every complete
    entry log, referenced or not, must not go unnoticed."""
    monkeypatch.setattr(bookie_gc, "removable_logs", lambda complete, _referenced: complete)
    for seed in range(500, 520):
        result = run_seed(seed)
        if not result.ok:
            return
    pytest.fail("a gc that removes live entry logs went unnoticed for 20 seeds")


def test_spread_check_asks_what_the_racks_left_allow() -> None:
    """Two racks left: E3 WQ3 can span both in every write set, E3 WQ2 cannot (three slots
    round a cycle, two racks); a write set in one rack is flagged only where two were
    possible."""
    assert best_spread(3, 3, {"/a/1": 3, "/a/2": 3}, 2) == 2
    assert best_spread(3, 2, {"/a/1": 3, "/a/2": 3}, 2) == 1
    assert best_spread(2, 2, {"/a/1": 3, "/a/2": 3}, 2) == 2
    assert best_spread(2, 2, {"/a/1": 6}, 2) == 1
    racks = {"b1": "/a/1", "b2": "/a/1", "c1": "/a/2", "c2": "/a/2"}
    alive = sorted(racks)

    def ledger(ensemble: tuple[str, ...], write_quorum: int) -> LedgerMetadata:
        return LedgerMetadata(
            ensemble_size=len(ensemble),
            write_quorum=write_quorum,
            ack_quorum=write_quorum,
            fragments=(Fragment(0, ensemble),),
            state=LedgerState.CLOSED,
            last_entry_id=9,
        )

    (short,) = short_of_racks(7, ledger(("b1", "b2"), 2), racks, alive)
    assert short.startswith("I15 ledger 7 not spread again"), short
    assert short_of_racks(7, ledger(("b1", "c1"), 2), racks, alive) == []
    assert short_of_racks(7, ledger(("b1", "b2", "c1"), 2), racks, alive) == []
    assert len(short_of_racks(7, ledger(("b1", "b2", "c1", "c2"), 2), racks, alive)) == 2


# Each protection switched off, with the fault pattern it exists for: the checker must catch
# the loss within a bounded number of seeds (docs/design/invariants.md). With it on, the same seeds
# hold (test_protections_on_hold_under_their_patterns).
#
# name -> (switches turned off, profile, journal-less, violation kind). Holding acks during an
# ensemble change only matters once the replacement can answer before the CAS: our writer by
# default sends to it only after the CAS (``replace_after_cas``, a second defence), so the
# tooth switches both off, and the "on" run keeps the second defence off to show that holding
# acks alone is enough.
TEETH: dict[str, tuple[tuple[str, ...], str, bool, str | tuple[str, ...]]] = {
    "recovery_reads_fence": (("recovery_reads_fence",), "unfenced_read", False, "I1"),
    # I11 (the lost fence) and often I1 as well
    "boot_fence": (("boot_fence",), "stale_writer", False, "I"),
    "boot_limbo": (("boot_limbo",), "lost_entry", True, "I1"),
    # I1 (recovery closed before an acknowledged entry) or I3 (the entry is on one bookie of
    # its write set in the metadata: the other copy went to a replacement the metadata lacks)
    "hold_acks_during_change": (
        ("hold_acks_during_change", "replace_after_cas"),
        "change_race",
        False,
        "I",
    ),
    # A worker holding a stale view of a ledger (its swap held at the store, its claim
    # lapsed) while a second worker repairs it for two lost bookies. Without the compare-and-set
    # on the version read, the stale swap writes the second lost bookie back into the ledger:
    # I15 (not repaired in time, and named in the final metadata).
    "metadata_version_fence": (("metadata_version_fence",), "worker_race", False, "I15"),
    # Producers dying with appends in flight and re-sending from their own record (or
    # handing the log on and re-sending their last few): without deduplication, a re-sent
    # sequence the log already holds lands again (I17).
    "deduplicate_producers": (("deduplicate_producers",), "producers", False, "I17"),
    # Placement at random over three racks of three, then one rack lost whole: some write set
    # had every copy in it. A closed ledger reads short (I2) or closes short (I1); an open
    # one whose every copy of an entry is gone cannot be recovered at all (I13).
    "spread_over_racks": (("spread_over_racks",), "racks", False, ("I1 ", "I2 ", "I13 ledger")),
}
TEETH_SEEDS = 60


@pytest.mark.timeout(240)
@pytest.mark.parametrize("protection", sorted(TEETH))
def test_checker_catches_each_protection_switched_off(protection: str) -> None:
    off, profile, journal_less, kind = TEETH[protection]
    options = SimOptions(
        switches=Switches(**dict.fromkeys(off, False)),
        profile=profile,
        journal_less=journal_less,
        stall_rate=0.0,
    )
    for seed in range(TEETH_SEEDS):
        result = run_seed(seed, options)
        if not result.ok:
            assert any(v.startswith(kind) for v in result.violations), result.report()
            return
    pytest.fail(f"{protection} off: no violation in {TEETH_SEEDS} seeds of profile {profile}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("protection", sorted(TEETH))
def test_protections_on_hold_under_their_patterns(protection: str) -> None:
    off, profile, journal_less, _kind = TEETH[protection]
    others = dict.fromkeys((s for s in off if s != protection), False)
    options = SimOptions(
        switches=Switches(**others), profile=profile, journal_less=journal_less, stall_rate=0.0
    )
    failed = [r for r in run_seeds(range(40), options) if not r.ok]
    assert not failed, _failures(failed)
