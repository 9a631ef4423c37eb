"""Offloading closed ledgers to the cluster's object store, and keeping the copies tidy.

- ``offload_ledger`` copies one closed ledger into one object and records it
  (``LedgerOffload`` says what it did); ``offload_log`` does it for a log's closed ledgers
  before a position (``OffloadReport``).
- ``release`` lets the bookies drop a copied ledger; ``upkeep`` is the leader's pass over the
  work list: releases after the deletion lag, dead attempts taken back (``UpkeepReport``).
- ``sweep`` removes objects and unfinished uploads no metadata names (``SweepReport``).
- ``Steps`` marks the points between an offload's steps, where the crash tests stop it.
- ``offload_ref`` says where an offloaded ledger's object is, for its readers.
"""

from aiobk.client.offload.copy import (
    LedgerOffload,
    OffloadSupersededError,
    discard,
    offload_ledger,
    release,
)
from aiobk.client.offload.log import OffloadReport, offload_log
from aiobk.client.offload.refs import is_released, offload_ref
from aiobk.client.offload.steps import NO_STEPS, POINTS, Steps
from aiobk.client.offload.sweep import SweepReport, sweep
from aiobk.client.offload.upkeep import UpkeepReport, upkeep

__all__ = [
    "NO_STEPS",
    "POINTS",
    "LedgerOffload",
    "OffloadReport",
    "OffloadSupersededError",
    "Steps",
    "SweepReport",
    "UpkeepReport",
    "discard",
    "is_released",
    "offload_ledger",
    "offload_log",
    "offload_ref",
    "release",
    "sweep",
    "upkeep",
]
