"""Why a ledger is under-replicated, and what holds its repair now (``aiobk autorecovery
explain``): a pure function from what the store and the bookies say to an explanation an
operator can act on. No I/O here; ``autorecovery.inspect`` gathers the facts.

Theory of operation. A worker repairs a marked ledger in the steps ``autorecovery.worker``
describes; each step has a way to stall, and each stall is named here by a ``kind`` the workers
also use when they record why an attempt stopped (``RepairAttempt``):

- nothing runs: autorecovery is disabled (``DISABLED``), or no autorecovery process is there
  to take the ledger (``NO_AUTORECOVERY``: no auditor is elected, and every autorecovery
  process stands for auditor);
- a worker holds it now (``CLAIMED``, since when, with its progress), perhaps paced by its
  byte-rate cap (``THROTTLED``);
- the ledger is open and its writer's fragment names a bookie to move: the writer usually
  replaces it itself, so the workers wait out ``open_ledger_rereplication_grace_period`` from
  the mark (``GRACE``); with a MAC digest only the writer (who has the password) can close
  it (``WRITER_ONLY``);
- no writable bookie outside a fragment's ensemble can take the copies (``NO_TARGET``: a copy
  of an entry per bookie, so a cluster of E bookies cannot repair an ensemble of E);
- no source copy can be read: every other bookie of an entry's write set is gone for good or
  said "no such entry" (``NO_SOURCE``: the entries will be reported lost), or some are down
  for now (``BOOKIE_ABSENT``: the copy waits for them, or for the auditor to call them lost);
- the last attempt failed or was put off, and the worker backs off until a time (``BACKOFF``,
  ``DEFERRED``);
- the mark is for placement (``MISPLACED``): no copy is missing, but a closed fragment's write
  set spans fewer racks than ``min_racks_per_write_quorum`` while another rack's bookie could
  take a copy; a worker moves one copy per such write set;
- none of these: it waits for a worker's next look (``QUEUED``).

A ledger with no mark may still be at risk: a bookie it names is absent but not yet lost (the
auditor marks it after ``lost_bookie_recovery_delay``), or a bookie lacks copies a check would
find (``NOT_MARKED``). Copies are judged from the first and last entries each bookie owes in
each closed fragment (what ``probe_plan`` lists and the caller asks), as the auditor's check
does.
"""

from aiobk.autorecovery.explain.decide import explain
from aiobk.autorecovery.explain.gather import explain_ledger, gather_facts
from aiobk.autorecovery.explain.model import (
    Blocker,
    CopyState,
    Explanation,
    FragmentState,
    LedgerFacts,
)
from aiobk.autorecovery.explain.probes import probe_plan

__all__ = [
    "Blocker",
    "CopyState",
    "Explanation",
    "FragmentState",
    "LedgerFacts",
    "explain",
    "explain_ledger",
    "gather_facts",
    "probe_plan",
]
