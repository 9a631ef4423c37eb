"""Autorecovery's settings, one frozen value: ``AutoRecoveryConfig``.

They are defined in the metadata layer, the lowest that both ``aiobk.autorecovery`` and the
bookie's config import: a bookie's TOML holds them as its ``[autorecovery]`` table, and the
bookie cannot import ``aiobk.autorecovery`` (a layer above it).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class AutoRecoveryConfig:
    """Autorecovery's settings, one frozen value: the ``[autorecovery]`` table of a bookie's
    TOML. Durations are float seconds, sizes bytes, names after BookKeeper's.

    Raises:
        ValueError: A setting is out of range.
    """

    # A bookie named in an ensemble and absent from the registry (neither writable nor
    # read-only) this long is lost: its ledgers are marked under-replicated. Long enough for a
    # restart or a rolling upgrade (BookKeeper's lostBookieRecoveryDelay, default 0 there).
    lost_bookie_recovery_delay: float = 60.0
    # Every ledger's closed fragments checked for missing copies this often; 0: never
    # (auditorPeriodicCheckInterval, a week).
    auditor_periodic_check_interval: float = 604_800.0
    # The lost-bookie check also runs this often, besides whenever the registry changes
    # (auditorPeriodicBookieCheckInterval, a day).
    auditor_periodic_bookie_check_interval: float = 86_400.0
    # Share (percent) of each bookie's entries in a fragment the periodic check asks about,
    # beyond the first and last (auditorLedgerVerificationPercentage).
    auditor_ledger_verification_percentage: float = 0.0
    # Ledgers checked at once by the periodic check (each asks its bookies a few reads).
    auditor_check_concurrency: int = 16
    # A ledger still open whose writer's ensemble lost a bookie: the writer usually replaces it
    # by itself; after this long a worker recovers (fences and closes) the ledger instead
    # (openLedgerRereplicationGracePeriod).
    open_ledger_rereplication_grace_period: float = 30.0
    # Copying throttle, bytes per second per worker; 0: unthrottled (replicationRateByBytes).
    rereplication_max_bytes_per_second: int = 0
    # Entries a worker reads and writes at once while copying (rereplicationEntryBatchSize is
    # 10 in BookKeeper; pulsar#1981: one ledger at a time with tiny batches took hours).
    rereplication_entries_in_flight: int = 64
    # A ledger whose repair failed waits this long before a worker takes it again, doubling up
    # to 32 times that (lockReleaseOfFailedLedgerGracePeriod's backoff).
    rereplication_retry_delay: float = 5.0
    # The lease under the auditor's election key and each worker's claim: a holder that dies
    # loses them this long after its last refresh.
    autorecovery_lease_ttl: float = 10.0
    # How often an idle worker looks for marks, and a candidate for a vacant auditor's seat
    # (each look is one or two store reads; jittered).
    autorecovery_poll_interval: float = 2.0
    # Racks each write set of a closed fragment should span, as the client's setting of the
    # same name: the auditor marks a ledger whose write sets span fewer while a move of a copy
    # to another rack's writable bookie would spread them, and the workers' copies spread this
    # far; 1 turns the placement check off.
    min_racks_per_write_quorum: int = 2
    # How often the auditor runs the offload pass: logs' offload policies applied, copied
    # ledgers released once the store's deletion lag has passed, offload attempts that died
    # taken back (docs/design/tiered-storage.md); 0: never.
    offload_interval: float = 60.0
    # An offload attempt, or a ledger listed for one, this old without finishing is taken as
    # dead: its object is deleted and the ledger can be offloaded again.
    offload_stale_after: float = 3600.0
    # How often the offload pass also sweeps the object store of objects and unfinished
    # uploads no ledger's metadata names; 0: never.
    offload_sweep_interval: float = 3600.0
    # Ledgers the offload pass copies at once.
    offload_concurrency: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0:
                raise ValueError(f"{f.name} must not be negative, got {value}")
        for name in (
            "auditor_check_concurrency",
            "rereplication_entries_in_flight",
            "rereplication_retry_delay",
            "autorecovery_lease_ttl",
            "autorecovery_poll_interval",
            "min_racks_per_write_quorum",
            "offload_stale_after",
            "offload_concurrency",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.auditor_ledger_verification_percentage > 100:
            raise ValueError("auditor_ledger_verification_percentage must be at most 100")


__all__ = ["AutoRecoveryConfig"]
