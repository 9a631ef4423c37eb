"""What an explanation is made of: the facts gathered about a ledger (``LedgerFacts``), what
holds its repair (``Blocker``, by kind), the state of each copy, and the ``Explanation`` with its
JSON and text forms. ``aiobk.autorecovery.explain`` has the theory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiobk.autorecovery.checker import Holding
from aiobk.autorecovery.config import AutoRecoveryConfig
from aiobk.metadata import AuditorStatus, LedgerMetadata, RepairAttempt, UnderReplication

# What holds a repair (``Blocker.kind``; a worker's ``RepairAttempt.kind`` is one of these).
NO_SUCH_LEDGER = "no-such-ledger"
DISABLED = "autorecovery-disabled"
NO_AUTORECOVERY = "no-autorecovery-process"
CLAIMED = "claimed"
THROTTLED = "throttled"
GRACE = "open-ledger-grace-period"
WRITER_ONLY = "open-ledger-mac-digest"
NO_TARGET = "no-bookie-outside-ensemble"
NO_SOURCE = "no-readable-source"
BOOKIE_ABSENT = "source-bookie-absent"
DAMAGED = "damaged-copies"
NO_KEY = "no-master-key"
CHANGED = "changed-meanwhile"
ERROR = "error"
BACKOFF = "retry-backoff"
QUEUED = "waiting-for-worker"
BOOKIE_BACK = "bookie-back"
NOT_MARKED = "not-marked-yet"
LOST_ENTRIES = "entries-lost"
MISPLACED = "placement"  # marked because a write set spans too few racks (no copy missing)

# Explanation.status
HEALTHY = "healthy"
UNDER_REPLICATED = "under-replicated"
LOST = "lost-entries"
AT_RISK = "not-marked"
GONE = "no-such-ledger"

# Copy states (``CopyState.state``)
HELD, MISSING, UNKNOWN, UNCHECKED = "held", "missing", "unknown", "unchecked"
LOST_BOOKIE, ABSENT, OPEN = "lost-bookie", "absent-bookie", "open"

MAX_FRAGMENTS_CHECKED = 64  # closed fragments whose copies are asked about (the rest: unchecked)

Probes = Mapping[tuple[str, int], Holding]  # (bookie, entry) -> what the bookie answered


@dataclass(frozen=True, slots=True)
class LedgerFacts:
    """What the store and the bookies said, gathered at ``now_ms``."""

    ledger_id: int
    now_ms: int
    metadata: LedgerMetadata | None  # None: no such ledger
    mark: UnderReplication | None = None
    claimant: str | None = None  # the worker holding the ledger's claim now
    attempt: RepairAttempt | None = None
    enabled: bool = True
    auditor: str | None = None
    status: AuditorStatus | None = None  # what the auditor published (lost, absent, settings)
    registered: frozenset[str] = frozenset()
    writable: frozenset[str] = frozenset()
    draining: frozenset[str] = frozenset()
    probes: Probes | None = None  # None: the bookies were not asked
    racks: Mapping[str, str] = field(default_factory=dict)  # registered bookies' racks

    def setting(self, name: str) -> float:
        """The auditor's published setting, else the default."""
        published = self.status.settings if self.status is not None else {}
        return float(published.get(name, getattr(AutoRecoveryConfig(), name)))


@dataclass(frozen=True, slots=True)
class Blocker:
    """One thing that holds the repair (or the ledger's mark), in words, with what an operator
    can do about it and, for a wait, when it ends by itself."""

    kind: str
    message: str
    actions: tuple[str, ...] = ()
    until: int | None = None  # ms when this wait ends by itself, when known

    def to_document(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "actions": list(self.actions),
            "until": self.until,
        }


@dataclass(frozen=True, slots=True)
class CopyState:
    """What one bookie of a fragment's ensemble holds of it, as far as known."""

    bookie: str
    state: str  # HELD, MISSING, UNKNOWN, UNCHECKED, LOST_BOOKIE, ABSENT, OPEN
    draining: bool = False


@dataclass(frozen=True, slots=True)
class FragmentState:
    """One fragment of the ledger and the state of each of its copies."""

    first: int
    last: int | None  # None: the writer's fragment of an open ledger
    ensemble: tuple[str, ...]
    copies: tuple[CopyState, ...]

    @property
    def missing(self) -> tuple[str, ...]:
        """The bookies whose copies of this fragment are missing or about to go."""
        bad = (MISSING, LOST_BOOKIE, ABSENT)
        return tuple(c.bookie for c in self.copies if c.state in bad or c.draining)

    def to_document(self) -> dict[str, Any]:
        return {
            "first_entry": self.first,
            "last_entry": self.last,
            "ensemble": list(self.ensemble),
            "copies": {c.bookie: c.state for c in self.copies},
            "draining": [c.bookie for c in self.copies if c.draining],
            "missing": list(self.missing),
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a ledger is (or is not) under-replicated and what holds its repair: its ``status``
    (``healthy``, ``under-replicated``, ``not-marked``, ``lost-entries``, ``no-such-ledger``),
    a one-line ``summary``, its fragments and their copies, and the ``blockers`` in the order
    they hold it, each with its ``actions``. ``to_document`` is the JSON shape, ``lines`` the
    text."""

    ledger_id: int
    status: str
    under_replicated: bool
    summary: str
    ledger_state: str | None = None
    mark: UnderReplication | None = None
    claimant: str | None = None
    attempt: RepairAttempt | None = None
    fragments: tuple[FragmentState, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    checked: bool = False  # the bookies were asked what they hold
    now_ms: int = 0

    @property
    def actions(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for blocker in self.blockers:
            for action in blocker.actions:
                seen.setdefault(action, None)
        return tuple(seen)

    @property
    def reason(self) -> str:
        """What holds it, in a few words (the first blocker's message)."""
        return self.blockers[0].message if self.blockers else self.summary

    def to_document(self) -> dict[str, Any]:
        """The ``--json`` shape (times in ms since the epoch)."""
        mark = self.mark
        attempt = self.attempt
        return {
            "ledger_id": self.ledger_id,
            "status": self.status,
            "under_replicated": self.under_replicated,
            "summary": self.summary,
            "ledger_state": self.ledger_state,
            "mark": None
            if mark is None
            else {
                "missing": list(mark.missing),
                "since": mark.since,
                "reasons": list(mark.reasons),
                "lost": [list(r) for r in mark.lost],
            },
            "claimed_by": self.claimant,
            "last_attempt": None
            if attempt is None
            else {
                "worker": attempt.worker,
                "state": attempt.state,
                "kind": attempt.kind or None,
                "detail": attempt.detail or None,
                "started": attempt.started,
                "updated": attempt.updated,
                "failures": attempt.failures,
                "retry_at": attempt.retry_at or None,
                "entries_to_copy": attempt.entries_to_copy,
                "entries_copied": attempt.entries_copied,
                "bytes_copied": attempt.bytes_copied,
                "max_bytes_per_second": attempt.max_bytes_per_second,
            },
            "copies_checked": self.checked,
            "fragments": [f.to_document() for f in self.fragments],
            "blockers": [b.to_document() for b in self.blockers],
            "actions": list(self.actions),
        }

    def lines(self) -> list[str]:
        """The text ``aiobk autorecovery explain`` prints."""
        out = [self.summary]
        if self.mark is not None:
            mark = self.mark
            why = ", ".join(mark.reasons) or "?"
            named = ", ".join(mark.missing) or "none left"
            out.append(f"marked: {when(mark.since, self.now_ms)} ({why}); copies of: {named}")
        if self.fragments:
            out.append("fragments:")
            out.extend("  " + _fragment_line(fragment) for fragment in self.fragments)
            if not self.checked:
                out.append("  (copies not asked about: states come from the store alone)")
        if self.blockers:
            out.append("what holds it:")
            out.extend(f"  - {b.message}" for b in self.blockers)
        if self.actions:
            out.append("what you can do:")
            out.extend(f"  - {a}" for a in self.actions)
        return out


def when(ms: int, now_ms: int) -> str:
    """A time for operators: UTC, and how long ago or from now."""
    at = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    delta = (now_ms - ms) / 1000
    return f"{at}, {span(abs(delta))} {'ago' if delta >= 0 else 'from now'}"


def span(seconds: float) -> str:
    """A duration in its largest whole unit (s, m, h, d)."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _fragment_line(fragment: FragmentState) -> str:
    span = (
        f"entries {fragment.first}-{fragment.last}"
        if fragment.last is not None
        else f"entries {fragment.first}- (open: the writer's)"
    )
    if fragment.last is not None and fragment.last < fragment.first:
        span = f"no entries (from {fragment.first})"
    copies = ", ".join(
        f"{c.bookie} {c.state}{' (draining)' if c.draining else ''}" for c in fragment.copies
    )
    return f"{span}: {copies}"
