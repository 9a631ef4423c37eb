"""What one soak run does, fixed before it starts.

The nominal intervals are those of a production week (retention every minute, a bookie lost
every few minutes); ``scaled`` shortens them for a run too short to see each several times.
The bookies' storage sizes are scaled down for every run: with the defaults (1 GiB entry logs,
512 MiB journal files, a GC pass every 5 minutes) a bookie at this load completes no entry log
within an hour, so garbage collection would reclaim nothing and the disk bound would judge
only the warm-up. With the sizes here a bookie completes an entry log and a journal file every
minute or so and the steady state is reached within the first minutes. etcd's history is
scaled the same way: it keeps 100,000 revisions by default (in memory, its key index and raft
log), about three hours of this load at ~10 revisions a second, so over an hour its memory
only grows; the soak keeps 10,000 (a quarter of an hour), compacted by etcd and by the
bookies' GC passes, and etcd snapshots (and trims its in-memory raft log) as often.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SoakSettings:
    seconds: float = 300.0  # of load, from the writer's first append to its stop
    seed: int = 0
    bookies: int = 4
    etcd_members: int = 3
    # The writer: a new append every 1/rate s, at most in_flight unanswered.
    rate: float = 400.0
    record_size: int = 1024
    in_flight: int = 64
    roll_bytes: int = 256 * 1024  # the log writer's ledger size
    # The operator and the nemesis (seconds between one and the next).
    truncate_interval: float = 60.0
    churn_interval: float = 2.0
    churn_keep: int = 8  # churn ledgers alive at once: each lives ~16 s, then is deleted
    churn_entries: tuple[int, int] = (16, 128)  # entries per churn ledger, drawn in this range
    kill_interval: float = 150.0
    kill_hold: tuple[float, float] = (1.0, 5.0)  # a killed bookie stays down this long
    etcd_interval: float = 600.0
    etcd_hold: tuple[float, float] = (1.0, 5.0)
    sample_interval: float = 5.0  # memory, disk and the registry
    # A running bookie out of the registry longer than this fails the run (a restarted bookie
    # registers as it starts; a lost lease is taken again within seconds).
    registry_grace: float = 60.0
    # The end: how long the reader has to catch up with the last acknowledgement.
    catch_up: float = 120.0
    # Growth allowed between the peaks of the second half's first and last eighths (checks):
    # a share of the earlier peak plus a floor. The floors: a process's RSS moves by a few MiB
    # (a bookie's by more, with restarts); a bookie's directory by an entry log and a journal
    # file between GC passes; etcd preallocates its write-ahead log in 64 MiB segments and
    # purges none before it has five.
    memory_growth_share: float = 0.10
    memory_growth_floor: int = 12 * MIB
    disk_growth_share: float = 0.10
    disk_growth_floor: int = 40 * MIB
    etcd_disk_growth_floor: int = 72 * MIB
    # The bookies (their TOML), see the module doc.
    entry_log_max_size: int = 16 * MIB
    journal_max_file_size: int = 16 * MIB
    gc_interval: float = 30.0
    etcd_history_revisions: int = 10_000  # etcd's auto-compaction and the bookies' compaction
    etcd_snapshot_count: int = 10_000

    @classmethod
    def scaled(cls, seconds: float, **changes: Any) -> SoakSettings:
        """Settings for a run of ``seconds``: each periodic operation at its nominal interval,
        or often enough to happen several times (truncations 6, bookie kills 3, etcd restarts
        2), whichever is sooner; samples often enough for the growth judgement."""
        base = cls(seconds=seconds)
        scaled = replace(
            base,
            truncate_interval=min(base.truncate_interval, seconds / 6),
            kill_interval=min(base.kill_interval, seconds / 3),
            etcd_interval=min(base.etcd_interval, seconds / 2),
            gc_interval=min(base.gc_interval, max(5.0, seconds / 10)),
            sample_interval=min(base.sample_interval, max(1.0, seconds / 60)),
        )
        return replace(scaled, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def bookie_toml(self) -> dict[str, Any]:
        return {
            "entry_log_max_size": self.entry_log_max_size,
            "journal_max_file_size": self.journal_max_file_size,
            "gc_interval": self.gc_interval,
            "metadata_history_revisions": self.etcd_history_revisions,
        }

    def etcd_args(self) -> tuple[str, ...]:
        return (
            "--auto-compaction-mode=revision",
            f"--auto-compaction-retention={self.etcd_history_revisions}",
            f"--snapshot-count={self.etcd_snapshot_count}",
        )
