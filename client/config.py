"""Client settings: one frozen value, durations in seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiobk.metadata.records import check_rack
from aiobk.protocol import DigestType


@dataclass(frozen=True, slots=True)
class ProtocolSwitches:
    """Each known protocol trap's fix, on by default. Tests and the simulator switch one off to
    show that the checker catches what it prevents (docs/design/invariants.md).
    Never switch these off in production."""

    recovery_reads_fence: bool = True  # trap 1: recovery reads carry FENCE
    recovery_start_floor: bool = True  # trap 2: start at max(LAC, fragment first entry - 1)
    recovery_changes_local: bool = True  # trap 3: recovery ensemble changes wait for the close
    recovery_frozen_lac: bool = True  # trap 4: write-backs carry the LAC frozen at the start
    hold_acks_during_change: bool = True  # acks wait for an ensemble change's CAS
    # A second line of defence behind the one above: the replacement gets its first entry only
    # once the new fragment is in the metadata, so before the CAS no ack can come from a bookie
    # the metadata does not name. Off, it is sent to as soon as it is chosen (a client optimising
    # the change's latency would); the hold above then is all that keeps such an ack from
    # acknowledging an entry that recovery, reading the old ensemble, can find absent.
    replace_after_cas: bool = True
    # A producer's writer learns the producer's last sequence from the log and does not append
    # a sequence at or below the last accepted again (exactly-once appends). Off, every
    # sequence is appended, as a log without producers would: a producer that re-sends what it
    # was unsure of after a crash writes duplicates.
    deduplicate_producers: bool = True
    # Placement spreads write sets over racks (client/placement.py). Off, ensembles and
    # replacements are chosen at random, as a cluster without racks chooses them: one rack lost
    # can then hold every copy of an entry.
    spread_over_racks: bool = True


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The client's settings: timeouts (seconds), budgets (bytes or counts) and defaults.

    Pass one to ``BookKeeper(uri, config)``; every field has a default. The configuration
    reference lists each field with its meaning.

    Raises:
        ValueError: A timeout, budget or count is not positive.
    """

    add_timeout: float = 10.0  # an add unanswered this long counts as a bookie failure
    read_timeout: float = 10.0  # per bookie, before giving up on it
    speculative_read_timeout: float = 0.5  # no answer yet: ask the next bookie as well
    connect_timeout: float = 5.0  # TCP connect + handshake
    metadata_timeout: float = 5.0  # each metadata store call
    digest_type: DigestType = DigestType.CRC32C  # of new ledgers: CRC32C, or MAC (HMAC-SHA256)
    # append() waits beyond this many unfinished adds, counted over the whole client (all of its
    # ledgers share one FIFO budget, as BookKeeper's maxAddsInProgress).
    max_outstanding_adds: int = 10_000
    # ... or beyond this many payload bytes of unfinished adds, whole client: each one is held
    # encoded until its bookies answer, so this bounds what queued appends cost in memory.
    # 64 MiB keeps a fast disk busy and is above one frame (5 MiB); an append larger than it
    # is not refused but waits until nothing else is outstanding and goes alone.
    max_outstanding_bytes: int = 64 * 1024 * 1024
    reconnect_backoff_min: float = 0.1  # after a failed connect, the bookie is skipped this long
    reconnect_backoff_max: float = 5.0  # ... doubling up to this
    read_concurrency: int = 64  # entries fetched in parallel by one read() or read_iter()
    # read() refuses (ReadTooLargeError) a range whose payloads pass this: it returns one list,
    # so it would hold the whole range in memory; read_iter() streams ranges of any size.
    max_read_bytes: int = 64 * 1024 * 1024
    # read_iter() and read_from() fetch ahead of their consumer while the entries fetched but
    # not yet consumed (counted at the largest size seen) stay within this.
    read_ahead_bytes: int = 8 * 1024 * 1024
    long_poll_timeout: float = 10.0  # server-side wait of one long poll
    # A writer that goes quiet sends its LAC explicitly (WRITE_LAC) this long after its last
    # add completed, so tailing readers see the last entry too (BookKeeper's
    # explicitLacInterval). 0 disables: the last entry then shows only with the next add.
    explicit_lac_delay: float = 0.1
    recovery_read_window: int = 16  # recovery reads in flight at once
    metadata_retries: int = 20  # compare-and-set attempts before giving up
    # An ensemble change or a close that finds the metadata store unreachable retries (with
    # backoff, acknowledgements held) this long before failing the ledger: rides out an etcd
    # restart or leader election. Each attempt may take metadata_timeout on top.
    metadata_retry_timeout: float = 30.0
    bookie_list_ttl: float = 2.0  # how long a fetched list of writable bookies is reused
    # Failure domains (docs/design/placement.md): every write set of a new ensemble, a
    # replacement and a re-replicated copy spans at least this many racks when the writable
    # bookies are in that many, and as many zones as it can.
    min_racks_per_write_quorum: int = 2
    # True: a placement that cannot span min_racks_per_write_quorum racks is refused
    # (NotEnoughBookiesError naming the constraint). False: it is made, logged and counted
    # (placement_short_of_racks in the client's figures).
    enforce_min_racks: bool = False
    # The client's own rack, /ZONE/RACK: reads ask a bookie in it first, then one in its zone,
    # then the rest (None: in write-set order).
    rack: str | None = None
    # Each protocol trap's fix, on (ProtocolSwitches); switched off only by tests.
    switches: ProtocolSwitches = field(default_factory=ProtocolSwitches)

    def __post_init__(self) -> None:
        for name in (
            "add_timeout",
            "read_timeout",
            "speculative_read_timeout",
            "connect_timeout",
            "metadata_timeout",
            "max_outstanding_adds",
            "max_outstanding_bytes",
            "reconnect_backoff_min",
            "reconnect_backoff_max",
            "read_concurrency",
            "max_read_bytes",
            "read_ahead_bytes",
            "long_poll_timeout",
            "recovery_read_window",
            "metadata_retries",
            "metadata_retry_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"ClientConfig.{name} must be positive")
        if self.min_racks_per_write_quorum < 1:
            raise ValueError("ClientConfig.min_racks_per_write_quorum must be at least 1")
        if self.rack is not None:
            check_rack(self.rack)
        if self.explicit_lac_delay < 0:
            raise ValueError("ClientConfig.explicit_lac_delay must not be negative (0 disables)")
