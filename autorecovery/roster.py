"""The cluster's bookies as ``aiobk bookies list`` shows them: the registered ones with when
each was last heard from, and the lost ones -- known to the cluster, no longer registered.

Three sources in the store, none of them new:

- **The registry.** A bookie's registration lives under a lease it refreshes every third of the
  lease's TTL (``metadata.lease``); a killed bookie stays registered, in its last state, until
  the TTL runs out. The lease's age (``MetadataStore.bookie_leases``) is when the bookie was
  last heard from; a bookie silent for longer than one refresh and some slack is ``late``: it
  has missed a refresh, and is dead or cut off from the store if it stays so.
- **The cookies.** Every bookie that ever booted against the store has one (BP-46's cookie)
  until it is decommissioned: one without a registration is a lost bookie.
- **The auditor's published status** (``aiobk autorecovery status``): the bookies it has
  seen absent -- registered once, or named in some ledger's ensemble -- with the time it first
  saw each absent; a lost bookie's ``absent_since`` comes from there (without an auditor, no
  time is known). A bookie the auditor holds lost (absent past
  ``lost_bookie_recovery_delay``, its ledgers being re-replicated) is listed lost even with
  no cookie left; one merely absent without a cookie is not (a decommissioned bookie stays in
  the auditor's view until its next bookie check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiobk.metadata import AuditorStatus, BookieServiceInfo, Cookie, MetadataStore

LOST = "lost"  # the state of a known bookie with no registration
# Beyond one refresh period (a third of the TTL): etcd counts a lease's time to live in whole
# seconds, and the refresh itself takes a round trip.
LATE_SLACK = 1.5


@dataclass(frozen=True, slots=True)
class RosterEntry:
    bookie_id: str
    address: str
    state: str  # writable, readonly, or lost
    software_version: str = ""
    free_bytes: int = 0
    total_bytes: int = 0
    last_heard: int | None = None  # ms since the epoch of its last lease refresh; None: unknown
    late: bool = False  # registered, and silent for longer than a refresh should take
    absent_since: int | None = None  # lost: ms since the epoch the auditor first missed it
    lost_by_auditor: bool = False  # lost: past lost_bookie_recovery_delay, being re-replicated
    rack: str | None = None  # registered: its failure domain (a lost one's is not known)

    @property
    def registered(self) -> bool:
        return self.state != LOST

    def to_document(self) -> dict[str, Any]:
        """The ``--json`` object: the fields listed before lost bookies existed, then the
        new ones (times in milliseconds since the epoch, null when unknown)."""
        return {
            "id": self.bookie_id,
            "address": self.address,
            "state": self.state,
            "software_version": self.software_version,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "registered": self.registered,
            "last_heard": self.last_heard,
            "late": self.late,
            "absent_since": self.absent_since,
            "lost_by_auditor": self.lost_by_auditor,
            "rack": self.rack,
        }


def roster(
    registered: list[BookieServiceInfo],
    leases: dict[str, tuple[float, float]],
    cookies: list[Cookie],
    status: AuditorStatus | None,
    now_ms: int,
) -> list[RosterEntry]:
    """The registered bookies, then the lost ones, each group by id (pure)."""
    out: list[RosterEntry] = []
    for info in sorted(registered, key=lambda b: b.bookie_id):
        heard = leases.get(info.bookie_id)
        last_heard = None if heard is None else now_ms - round(heard[0] * 1000)
        late = heard is not None and heard[0] > heard[1] / 3 + LATE_SLACK
        out.append(
            RosterEntry(
                info.bookie_id,
                info.address,
                info.state,
                info.software_version,
                info.free_bytes,
                info.total_bytes,
                last_heard,
                late,
                rack=info.rack,
            )
        )
    live = {info.bookie_id for info in registered}
    addresses = {cookie.bookie_id: cookie.address for cookie in cookies}
    absent: dict[str, int] = {}
    lost_by_auditor: set[str] = set()
    if status is not None:
        absent.update(status.missing_bookies)
        absent.update(status.lost_bookies)
        lost_by_auditor = set(status.lost_bookies)
    out.extend(
        RosterEntry(
            bookie_id,
            addresses.get(bookie_id, bookie_id),  # an id is its address unless named
            LOST,
            absent_since=absent.get(bookie_id),
            lost_by_auditor=bookie_id in lost_by_auditor,
        )
        for bookie_id in sorted((set(addresses) | lost_by_auditor) - live)
    )
    return out


async def gather_roster(store: MetadataStore, now_ms: int) -> list[RosterEntry]:
    """Read the three sources (a few range reads, and one lease lookup per registered
    bookie, all at once) and combine them."""
    registered = await store.list_bookies()
    leases = await store.bookie_leases()
    cookies = await store.list_cookies()
    status = await store.autorecovery.read_status()
    return roster(registered, leases, cookies, status, now_ms)


__all__ = ["LATE_SLACK", "LOST", "RosterEntry", "gather_roster", "roster"]
