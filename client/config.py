"""Client settings: one frozen value, durations in seconds (STYLE 6)."""

from __future__ import annotations

from dataclasses import dataclass

from protocol import DigestType


@dataclass(frozen=True, slots=True)
class ClientConfig:
    add_timeout: float = 10.0  # an add unanswered this long counts as a bookie failure
    read_timeout: float = 10.0  # per bookie, before trying the next one
    connect_timeout: float = 5.0  # TCP connect + handshake
    metadata_timeout: float = 5.0  # each metadata store call
    digest_type: DigestType = DigestType.CRC32C
    max_outstanding_adds: int = 10_000  # append() waits beyond this many unfinished adds
    reconnect_backoff_min: float = 0.1  # after a failed connect, the bookie is skipped this long
    reconnect_backoff_max: float = 5.0  # ... doubling up to this
    read_concurrency: int = 64  # entries fetched in parallel by one read()
    long_poll_timeout: float = 10.0  # server-side wait of one long poll
    recovery_read_window: int = 16  # recovery reads in flight at once
    metadata_retries: int = 20  # compare-and-set attempts before giving up
    bookie_list_ttl: float = 2.0  # how long a fetched list of writable bookies is reused

    def __post_init__(self) -> None:
        for name in (
            "add_timeout",
            "read_timeout",
            "connect_timeout",
            "metadata_timeout",
            "max_outstanding_adds",
            "reconnect_backoff_min",
            "reconnect_backoff_max",
            "read_concurrency",
            "long_poll_timeout",
            "recovery_read_window",
            "metadata_retries",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"ClientConfig.{name} must be positive")
