"""Why a bookie's disk is not reclaimed: per entry log, its live and total bytes, what garbage
collection will do with it and why it keeps it (``aiobk bookie gc --report``, HTTP
``gc_details``). Pure: ``GarbageCollector.report`` gathers the facts.

Theory ("Deleting ledgers and reclaiming disk" in the docs, and ``bookie.gc``). An entry log
holds entries of many ledgers. A pass removes a complete log once no ledger still held has
entries in it, and compacts one whose live entries are under ``gc_compaction_threshold`` of its
records (copies them to the log taking appends, then removes it) -- at most
``COMPACT_LOGS_PER_PASS`` a pass, emptiest first. So a log's space stays taken while:

- it is the log taking appends (``ACTIVE``: a pass takes the logs older than it, after a
  checkpoint has written them out);
- some ledger it holds lives and its live share is at or above the threshold (``KEPT``) --
  the ledgers keeping it are named, with what the metadata says of them: still open (its
  writer goes on) or closed; one the metadata says is deleted is not live (the next pass drops
  it first), and is named as what the log waits for;
- compaction is off (``NO_COMPACTION``), or could not move a damaged record (``STUCK``);
- its records were never counted, so its share is unknown yet (``UNMEASURED``).

And it goes at the next pass when nothing lives in it (``REMOVABLE``) or its share is under the
threshold (``COMPACTABLE``, or ``QUEUED`` behind the emptier ones a pass takes first). Live
bytes are the bytes of the records the live ledgers appended to the log (kept per log beside
it); where a log's per-ledger bytes are not known they are estimated from its records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ACTIVE = "active"
REMOVABLE = "removable"
COMPACTABLE = "compactable"
QUEUED = "queued"
KEPT = "kept"
NO_COMPACTION = "compaction-off"
STUCK = "stuck"
UNMEASURED = "unmeasured"

KEPT_BY_SHOWN = 3  # ledgers named as keeping a log
# Logs a report details (all count in its totals): at most ~1.3 MiB of JSON, well inside the
# 5 MiB frame that carries it to ``aiobk bookie gc``, on a bookie of many small entry logs.
REPORT_LOGS = 2000


@dataclass(frozen=True, slots=True)
class LogFacts:
    log_id: int
    total_bytes: int  # the file (and, for the active log, its buffer)
    state: str = ""  # ACTIVE for the log taking appends; "" for the others
    records: int | None = None  # records in the log, when known
    entries: Mapping[int, int] = field(default_factory=dict)  # ledger -> entries appended
    ledger_bytes: Mapping[int, int] | None = None  # ledger -> record bytes (None: not known)


@dataclass(frozen=True, slots=True)
class LedgerFacts:
    """What this bookie knows of a ledger with entries in some log."""

    held: bool  # still held here (False: dropped by gc, its entries dead)
    limbo: bool = False
    metadata: str | None = None  # "open", "closed", "deleted" when asked; None: not asked


@dataclass(frozen=True, slots=True)
class LogReport:
    log_id: int
    state: str
    reason: str
    total_bytes: int
    live_bytes: int
    live_bytes_estimated: bool
    records: int | None
    live_entries: int
    reclaimable_bytes: int  # what the next passes free by removing or compacting it
    kept_by: tuple[tuple[int, int, str], ...] = ()  # (ledger, live bytes, what it is)

    @property
    def live_share(self) -> float | None:
        if not self.records:
            return None
        return self.live_entries / self.records

    def to_document(self) -> dict[str, Any]:
        share = self.live_share
        return {
            "log_id": self.log_id,
            "file": f"{self.log_id:08x}.log",
            "state": self.state,
            "reason": self.reason,
            "total_bytes": self.total_bytes,
            "live_bytes": self.live_bytes,
            "live_bytes_estimated": self.live_bytes_estimated,
            "records": self.records,
            "live_entries": self.live_entries,
            "live_share": None if share is None else round(share, 4),
            "reclaimable_bytes": self.reclaimable_bytes,
            "kept_by": [
                {"ledger_id": ledger, "live_bytes": size, "ledger": what}
                for ledger, size, what in self.kept_by
            ],
        }


def _lives(ledger: LedgerFacts) -> bool:
    """Its entries count as live: held here, and not known to be deleted (a deleted ledger
    still held is dropped by the next pass before it looks at the logs)."""
    return ledger.held and ledger.metadata != "deleted"


def _live(
    facts: LogFacts, ledgers: Mapping[int, LedgerFacts]
) -> tuple[int, int, bool, dict[int, int]]:
    """(live entries, live bytes, estimated, live bytes by ledger) of one log."""
    held = {
        ledger: count
        for ledger, count in facts.entries.items()
        if _lives(ledgers.get(ledger, LedgerFacts(held=True))) and count > 0
    }
    entries = sum(held.values())
    if facts.ledger_bytes is not None:
        by_ledger = {ledger: facts.ledger_bytes.get(ledger, 0) for ledger in held}
        return entries, sum(by_ledger.values()), False, by_ledger
    if not facts.records:
        return entries, 0 if not held else facts.total_bytes, True, {}
    share = min(1.0, entries / facts.records)
    by_ledger = {ledger: int(facts.total_bytes * n / facts.records) for ledger, n in held.items()}
    return entries, int(facts.total_bytes * share), True, by_ledger


def _ledger_words(ledger: LedgerFacts) -> str:
    if ledger.limbo:
        return "in limbo (waits for the boot repair)"
    return {
        "open": "still open (its writer may add to it)",
        "closed": "closed and live",
    }.get(ledger.metadata or "", "live")


def classify(
    logs: list[LogFacts],
    ledgers: Mapping[int, LedgerFacts],
    *,
    threshold: float,
    per_pass: int,
    stuck: frozenset[int] = frozenset(),
) -> list[LogReport]:
    """Each log's verdict (see the module docstring), in log order."""
    measured: list[tuple[float, int]] = []
    lives: dict[int, tuple[int, int, bool, dict[int, int]]] = {}
    for facts in logs:
        lives[facts.log_id] = _live(facts, ledgers)
        entries = lives[facts.log_id][0]
        records = facts.records or 0
        if not facts.state and 0 < entries < threshold * records:  # as the pass chooses
            measured.append((entries / records, facts.log_id))
    first = {log_id for _share, log_id in sorted(measured)[:per_pass]}
    out = []
    for facts in logs:
        entries, live_bytes, estimated, by_ledger = lives[facts.log_id]
        state, reason, reclaimable = _verdict(
            facts, entries, live_bytes, threshold, facts.log_id in first, facts.log_id in stuck
        )
        dropping = sorted(
            ledger
            for ledger, count in facts.entries.items()
            if count and ledgers.get(ledger, LedgerFacts(held=True)).metadata == "deleted"
        )
        if dropping and state in (REMOVABLE, COMPACTABLE, QUEUED):
            shown = ", ".join(map(str, dropping[:KEPT_BY_SHOWN]))
            reason += f", once it drops deleted ledger(s) {shown}"
        kept_by: tuple[tuple[int, int, str], ...] = ()
        if state in (KEPT, NO_COMPACTION, STUCK, UNMEASURED):
            top = sorted(by_ledger.items(), key=lambda item: (-item[1], item[0]))
            kept_by = tuple(
                (ledger, size, _ledger_words(ledgers.get(ledger, LedgerFacts(held=True))))
                for ledger, size in top[:KEPT_BY_SHOWN]
            )
        out.append(
            LogReport(
                facts.log_id,
                state,
                reason,
                facts.total_bytes,
                live_bytes,
                estimated,
                facts.records,
                entries,
                reclaimable,
                kept_by,
            )
        )
    return out


def _verdict(
    facts: LogFacts, entries: int, live_bytes: int, threshold: float, first: bool, stuck: bool
) -> tuple[str, str, int]:
    if facts.state == ACTIVE:
        return ACTIVE, "the log taking appends: only complete logs are collected", 0
    if entries == 0:
        return REMOVABLE, "no live entry: removed by the next pass", facts.total_bytes
    freed = max(0, facts.total_bytes - live_bytes)
    if stuck:
        return STUCK, "compaction could not move a damaged record out of it: kept", 0
    if threshold <= 0:
        return (
            NO_COMPACTION,
            "compaction is off (gc_compaction_threshold = 0): kept while any entry in it lives",
            0,
        )
    if not facts.records:
        return UNMEASURED, "its records are not counted yet: the next pass counts them", 0
    share = entries / facts.records
    words = f"{share:.0%} of its records live, gc_compaction_threshold {threshold:.0%}"
    if share >= threshold:
        return KEPT, f"{words}: kept until more of it is deleted", 0
    if first:
        return COMPACTABLE, f"{words}: compacted by the next pass", freed
    return QUEUED, f"{words}: compacted once the emptier logs before it are", freed


@dataclass
class GcProgress:
    """A pass while it runs (mutable: the pass updates it, reports read it)."""

    started: float  # wall-clock seconds
    phase: str = "finding deleted ledgers"
    ledgers_deleted: int = 0
    logs_removed: int = 0
    logs_to_compact: int = 0
    logs_compacted: int = 0
    compacting: int | None = None  # the log being compacted now
    log_bytes: int = 0  # its size
    bytes_scanned: int = 0  # how far into it the compaction has read
    entries_moved: int = 0
    bytes_moved: int = 0

    def to_document(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "phase": self.phase,
            "ledgers_deleted": self.ledgers_deleted,
            "logs_removed": self.logs_removed,
            "logs_to_compact": self.logs_to_compact,
            "logs_compacted": self.logs_compacted,
            "compacting_log": self.compacting,
            "compacting_log_bytes": self.log_bytes,
            "compacting_bytes_scanned": self.bytes_scanned,
            "entries_moved": self.entries_moved,
            "bytes_moved": self.bytes_moved,
        }


def report_document(
    reports: list[LogReport],
    *,
    threshold: float,
    progress: Mapping[str, Any] | None,
    last_pass: Mapping[str, Any] | None,
    limit: int = REPORT_LOGS,
) -> dict[str, Any]:
    """The report's JSON document (what HTTP ``gc_details`` and GC_REPORT carry): past
    ``limit`` logs, those with the most to reclaim, then the largest, are detailed."""
    shown = reports
    if len(reports) > limit:
        first = sorted(reports, key=lambda r: (-r.reclaimable_bytes, -r.total_bytes, r.log_id))
        shown = sorted(first[:limit], key=lambda r: r.log_id)
    return {
        "compaction_threshold": threshold,
        "logs": [r.to_document() for r in shown],
        "logs_total": len(reports),
        "total_bytes": sum(r.total_bytes for r in reports),
        "live_bytes": sum(r.live_bytes for r in reports),
        "reclaimable_bytes": sum(r.reclaimable_bytes for r in reports),
        "running": dict(progress) if progress is not None else None,
        "last_pass": dict(last_pass) if last_pass is not None else None,
    }


__all__ = [
    "ACTIVE",
    "COMPACTABLE",
    "KEPT",
    "NO_COMPACTION",
    "QUEUED",
    "REMOVABLE",
    "REPORT_LOGS",
    "STUCK",
    "UNMEASURED",
    "GcProgress",
    "LedgerFacts",
    "LogFacts",
    "LogReport",
    "classify",
    "report_document",
]
