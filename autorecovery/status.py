"""What an operator asks of autorecovery (``aiobk autorecovery status``,
``list-underreplicated``): gathered from the store alone, so it answers whichever process
audits, and while none does.

The store holds two views that can disagree for a moment: the marks (written by the auditor,
removed by the workers: the truth about what still needs work) and the status the auditor
publishes under its lease every few seconds (which bookies it holds lost or absent, when its
checks last ran). Counts are taken from the marks; the auditor's status is shown as the
auditor's, and is absent while no auditor has published one (it goes with the auditor's lease).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiobk.metadata import MetadataStore, UnderReplication


@dataclass(frozen=True, slots=True)
class LostLedger:
    """A ledger some of whose entries no bookie has any more (reported, never retried)."""

    ledger_id: int
    ranges: tuple[tuple[int, int], ...]  # inclusive entry ranges

    def to_document(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id, "ranges": [list(r) for r in self.ranges]}


@dataclass(frozen=True, slots=True)
class StatusReport:
    enabled: bool
    auditor: str | None  # the elected auditor's id (None: no candidate holds the seat)
    # From the auditor's published status (empty, and the check times None, when none is):
    lost_bookies: dict[str, int] = field(default_factory=dict)  # id -> ms since absent
    absent_bookies: dict[str, int] = field(default_factory=dict)  # gone, not yet lost
    last_check: int | None = None  # ms when the last full check ended
    last_bookie_check: int | None = None  # ms when the last lost-bookie check ended
    status_from: str | None = None  # which auditor published the status shown
    # From the marks:
    under_replicated: int = 0  # marks naming bookies whose copies are missing
    lost_ledgers: tuple[LostLedger, ...] = ()
    decommissioning: tuple[str, ...] = ()

    def to_document(self) -> dict[str, Any]:
        """The ``--json`` shape (times in milliseconds since the epoch, null when never)."""
        return {
            "auditor": self.auditor,
            "enabled": self.enabled,
            "lost_bookies": dict(sorted(self.lost_bookies.items())),
            "absent_bookies": dict(sorted(self.absent_bookies.items())),
            "under_replicated_ledgers": self.under_replicated,
            "lost_ledger_count": len(self.lost_ledgers),
            "lost_ledgers": [ledger.to_document() for ledger in self.lost_ledgers],
            "last_check": self.last_check,
            "last_bookie_check": self.last_bookie_check,
            "status_from": self.status_from,
            "decommissioning": list(self.decommissioning),
        }


@dataclass(frozen=True, slots=True)
class MarkedLedger:
    """One mark as ``list-underreplicated`` shows it, with the worker repairing it now."""

    mark: UnderReplication
    claimed_by: str | None = None

    def to_document(self) -> dict[str, Any]:
        mark = self.mark
        return {
            "ledger_id": mark.ledger_id,
            "missing": list(mark.missing),
            "since": mark.since,
            "reasons": list(mark.reasons),
            "lost": [list(r) for r in mark.lost],
            "claimed_by": self.claimed_by,
        }


async def gather_status(store: MetadataStore) -> StatusReport:
    """One pass over the marks (a page at a time) and a few single reads."""
    recovery = store.autorecovery
    enabled = await recovery.enabled()
    auditor = await recovery.auditor()
    published = await recovery.read_status()
    under = 0
    lost: list[LostLedger] = []
    async for mark in recovery.marks():
        under += bool(mark.missing)
        if mark.lost:
            lost.append(LostLedger(mark.ledger_id, mark.lost))
    draining = tuple(sorted(await recovery.decommissioning()))
    if published is None:
        return StatusReport(
            enabled,
            auditor,
            under_replicated=under,
            lost_ledgers=tuple(lost),
            decommissioning=draining,
        )
    return StatusReport(
        enabled,
        auditor,
        dict(published.lost_bookies),
        dict(published.missing_bookies),
        published.last_check or None,
        published.last_bookie_check or None,
        published.auditor,
        under,
        tuple(lost),
        draining,
    )


async def under_replicated(
    store: MetadataStore, *, with_claims: bool = False
) -> list[MarkedLedger]:
    """The ledgers waiting for repair: marks that still name bookies whose copies are missing
    (a mark left only as a report of lost entries is not one; ``gather_status`` lists those).
    ``with_claims`` also asks, one read per ledger, which worker holds each now."""
    recovery = store.autorecovery
    out: list[MarkedLedger] = []
    async for mark in recovery.marks():
        if not mark.missing:
            continue
        claimant = await recovery.claimant(mark.ledger_id) if with_claims else None
        out.append(MarkedLedger(mark, claimant))
    return out


__all__ = ["LostLedger", "MarkedLedger", "StatusReport", "gather_status", "under_replicated"]
