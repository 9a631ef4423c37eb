"""Autorecovery on etcd: an auditor elected among the bookies finds ledgers whose
copies are missing -- a bookie lost for good, a check that finds entries gone -- and replication
workers copy them to other bookies, changing each fragment's ensemble by compare-and-set.
BookKeeper's ``replication/`` package, which its etcd driver does not support."""

from aiobk.autorecovery.auditor import Auditor
from aiobk.autorecovery.config import AutoRecoveryConfig
from aiobk.autorecovery.explain import Explanation, explain_ledger
from aiobk.autorecovery.service import AutoRecovery
from aiobk.autorecovery.stats import AutoRecoveryStats
from aiobk.autorecovery.worker import Outcome, ReplicationWorker, WorkerSwitches

__all__ = [
    "Auditor",
    "AutoRecovery",
    "AutoRecoveryConfig",
    "AutoRecoveryStats",
    "Explanation",
    "Outcome",
    "ReplicationWorker",
    "WorkerSwitches",
    "explain_ledger",
]
