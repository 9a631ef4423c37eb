"""Bookie settings: one frozen value built at the edge (TOML file, CLI flags) and passed down.

Names follow BookKeeper's settings in snake case; durations are float seconds, sizes bytes.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import warnings
from dataclasses import dataclass
from typing import Any

from aiobk.bookie.journal.policy import JOURNAL_ALIGNMENT
from aiobk.metadata.autorecovery_config import AutoRecoveryConfig
from aiobk.metadata.records import DEFAULT_RACK, check_rack
from aiobk.metadata.uri import redact_uri

# The largest frame a bookie may be set to take: an add must fit one journal record (64 MiB).
MAX_FRAME_SIZE = 64 * 1024 * 1024 - 64 * 1024

# The [autorecovery] table's keys. A file may also name each flat, beside the bookie's own
# settings (deprecated: a FutureWarning names the table's key); a flag or an override of the
# same name is no deprecated spelling and goes to the table without one.
AUTORECOVERY_FIELDS = {f.name: f for f in dataclasses.fields(AutoRecoveryConfig)}
FLAT_AUTORECOVERY = frozenset(AUTORECOVERY_FIELDS)
# Keys no setting reads, and why: a file may hold them; each is skipped with a warning.
IGNORED = {"index_full_snapshot_every": "the RocksDB index has no snapshots"}


class ConfigError(ValueError):
    """A setting is missing, unknown or out of range."""


@dataclass(frozen=True, slots=True)
class BookieConfig:
    """A bookie's settings: what ``aiobk bookie start`` reads from its TOML file and flags.

    Durations are float seconds, sizes bytes; names follow BookKeeper's settings in snake
    case. Only ``data_dir`` is required. The configuration reference lists each field.

    Raises:
        ConfigError: A setting is missing, out of range, or inconsistent with another.
    """

    data_dir: str  # ledger storage: entry logs (ledgers/entries) and the index (ledgers/index.db)
    port: int = 3181  # where the bookie listens (BookKeeper's default bookiePort)
    host: str = "127.0.0.1"  # the address it listens on: loopback unless told otherwise
    journal_dir: str | None = None  # default: DATA_DIR/journal (a separate disk is faster)
    bookie_id: str | None = None  # default: the advertised host:port
    # The host:port clients dial, registered in the metadata store (a proxy, NAT, a name). Unset:
    # host:port, except that a host listening on every interface (0.0.0.0, ::) publishes this
    # machine's address toward other hosts (its default route's source address), and a bookie
    # on a machine with no such address refuses to start until this is set (bookie.advertised).
    advertised_address: str | None = None
    # etcd://[USER:PASSWORD@]HOST:PORT/PREFIX or memory://NAME; None runs unregistered.
    metadata_uri: str | None = None
    # Its failure domain, /ZONE/RACK (or /RACK), in its registration: clients spread every
    # write set over racks and zones (docs/design/placement.md).
    rack: str = DEFAULT_RACK
    registration_ttl: float = 10.0  # lease TTL: a dead bookie vanishes from the registry after it
    # BP-46: rewrite disagreeing cookies at boot (and then fence and recover) instead of refusing.
    allow_cookie_fix: bool = False
    # BP-46 protections at boot after possible data loss. Switching them off is only for tests
    # that demonstrate Scenarios 1 and 2; never in production.
    boot_fence: bool = True  # fence every ledger this bookie holds before serving
    boot_limbo: bool = True  # put the unclosed ones in limbo (EUNKNOWN, never NoSuchEntry)
    boot_repair: bool = True  # phase two: recover limbo ledgers, copy back, clear limbo
    repair_retry_interval: float = 1.0  # seconds between passes over ledgers not repaired yet
    # BP-46: when false, adds skip the journal (acknowledged once in ledger storage).
    journal_write_data: bool = True
    # Group commit, after journalMaxGroupWaitMSec / journalBufferedWritesThreshold /
    # journalFlushWhenQueueEmpty. Our writer flushes whatever queued while the previous
    # fdatasync ran, so flushing when the queue is empty already batches under load and keeps
    # one idle add at one fdatasync; set it false to trade idle latency for fewer syncs.
    journal_max_group_wait: float = 0.002  # longest an add waits for company (flag below off)
    journal_buffered_writes_threshold: int = 512 * 1024  # write once this many bytes queue
    journal_flush_when_queue_empty: bool = True  # write as soon as the writer is free
    journal_max_file_size: int = 512 * 1024 * 1024  # roll journal files at this size
    journal_sync_data: bool = True  # fdatasync the journal (false only for experiments)
    # Pad each journal write to this boundary (BookKeeper's journalAlignmentSize; 0: no
    # padding): the sector by default, 4096 on a disk that needs stable pages (journal.policy).
    journal_alignment: int = JOURNAL_ALIGNMENT
    # BP-14: a journal batch holding only volatile adds (answered once written) waits up to
    # this long for an fdatasync that other work brings anyway; 0 syncs each batch at once.
    journal_volatile_sync_delay: float = 0.005
    entry_log_max_size: int = 1024 * 1024 * 1024  # BookKeeper's logSizeLimit
    entry_log_write_buffer: int = 4 * 1024 * 1024  # buffered in memory before a write()
    flush_interval: float = 10.0  # seconds between checkpoints (BookKeeper's flushInterval)
    # Memory of ledger storage, whatever the bookie holds on disk (bounded by these alone).
    # Entry locations and ledger changes since the last checkpoint; a full cache starts a
    # checkpoint at once (BookKeeper's dbStorage_writeCacheMaxSizeMb).
    write_cache_max_size: int = 64 * 1024 * 1024
    read_cache_max_size: int = 16 * 1024 * 1024  # entries recently read from disk (0: none)
    # The index engine's block cache: data, index and bloom-filter blocks
    # (dbStorage_rocksDB_blockCacheSize).
    index_cache_size: int = 64 * 1024 * 1024
    index_write_buffer_size: int = 16 * 1024 * 1024  # a memtable; all of them within twice this
    # Ledger states kept loaded after a checkpoint; idle ones beyond it are dropped and read
    # back from the index when asked for.
    ledger_state_cache_size: int = 10_000
    # Seconds between garbage collection passes that reclaim deleted ledgers' disk
    # (BookKeeper's gcWaitTime); 0 turns it off. Needs the metadata store.
    gc_interval: float = 300.0
    # Compact a complete entry log whose live entries are under this share of its records
    # (their copies go to the active log, then the log goes); 0 turns compaction off.
    gc_compaction_threshold: float = 0.5
    # After each GC pass, let etcd forget all but this many revisions of history (etcd keeps
    # every revision until compacted and refuses all writes at its quota); 0: leave it to
    # etcd's own --auto-compaction-retention (a warning at start says so).
    metadata_history_revisions: int = 100_000
    max_frame_size: int = 5 * 1024 * 1024  # nettyMaxFrameSizeBytes
    max_inflight_per_connection: int = 10_000  # pause reading a client beyond this
    max_long_poll_timeout: float = 120.0  # caps a client's long-poll wait
    # Flow control (bookie.flow): what peers can make the bookie hold, each bounded.
    max_connections: int = 4096  # at the cap, the connection idle longest makes room
    connection_idle_timeout: float = 600.0  # nothing in flight and silent this long: closed
    frame_timeout: float = 30.0  # a frame must be complete this long after its first byte
    write_timeout: float = 60.0  # responses unsendable this long (a peer reading nothing): closed
    # Responses queued for one peer: above the high mark stop reading its requests and hold
    # its reads (BookKeeper's serverWriteBufferHighWaterMark); resume below the low one.
    server_write_buffer_high_water_mark: int = 1024 * 1024
    server_write_buffer_low_water_mark: int = 256 * 1024  # ... and below it, both resume
    # Partial frames plus queued responses of all connections; above it the biggest holder
    # is closed. A quarter of a small host's RAM at most; must fit two largest frames.
    max_connection_memory: int = 256 * 1024 * 1024
    max_reads_in_progress: int = 64  # entry reads fetching at once (maxReadsInProgressLimit)
    # Bytes of adds received and not yet answered; above it every peer waits for the journal.
    max_add_bytes_in_progress: int = 64 * 1024 * 1024
    # Full disks (bookie.disk_monitor), BookKeeper's names and defaults.
    disk_check_interval: float = 10.0  # seconds between usage checks (diskCheckInterval)
    disk_usage_threshold: float = 0.95  # above it on any disk: read-only
    disk_usage_warn_threshold: float = 0.90  # above it: garbage collection is forced
    disk_usage_lwm_threshold: float = 0.90  # at or below it on every disk: writable again
    # Read-only still takes recovery adds while every disk has this much free (100 MB).
    min_usable_size_for_high_priority_writes: int = 100 * 1024 * 1024
    # Set aside on each filesystem (at most 5% of it) and given back on a full disk, so that
    # checkpoints, garbage collection, fences and a clean stop can still write; 0: none.
    disk_reserved_space: int = 64 * 1024 * 1024
    max_long_polls: int = 100_000  # waiting at once, bookie-wide (a few hundred bytes each)
    max_long_polls_per_connection: int = 10_000  # one more is answered ETOOMANYREQUESTS
    metrics_port: int | None = None  # Prometheus exporter; None disables it
    # The HTTP admin API (aiobk.http_admin): off unless a port is given; it listens on the
    # bookie's host unless http_host says otherwise (an admin port is best kept off 0.0.0.0).
    http_port: int | None = None
    http_host: str | None = None  # the admin API's address; default: host
    # Autorecovery: an auditor elected among the bookies and a replication worker in each copy
    # a lost bookie's entries to others.
    autorecovery_enabled: bool = True  # run a worker and an auditor candidate beside the bookie
    # The settings of the autorecovery running beside the bookie (and of `aiobk autorecovery
    # start --config`): the [autorecovery] table, whose keys the Autorecovery table lists.
    autorecovery: AutoRecoveryConfig = dataclasses.field(default_factory=AutoRecoveryConfig)
    # TLS on the bookie port (docs/operations/security.md), after BookKeeper's tlsCertificatePath,
    # tlsKeyStore, tlsTrustStore, tlsClientAuthentication. With a certificate and key the bookie
    # offers TLS (clients ask with START_TLS, as BookKeeper's do); its own client connections
    # (repair, autorecovery) use TLS too, with the same certificate as their identity. The CA
    # file is what peers' certificates must chain to. tls_client_auth requires and verifies a
    # client certificate, whose OU attributes are the peer's roles (admin, bookie, client);
    # tls_only refuses every request on a connection that has not upgraded. The files are read
    # again every tls_reload_interval seconds when they change (new connections use the new
    # ones; 0: never), as tlsCertFilesRefreshDurationSeconds.
    tls_cert_file: str | None = None  # the bookie's certificate (PEM); with a key, offers TLS
    tls_key_file: str | None = None  # its private key (PEM)
    tls_ca_file: str | None = None  # what peers' certificates must chain to (PEM)
    tls_client_auth: bool = False  # require a client certificate; its OU attributes are roles
    tls_only: bool = False  # refuse every request on a connection that has not upgraded
    tls_reload_interval: float = 60.0  # seconds between looks at the files for renewals (0: never)
    log_level: str = "info"  # debug, info, warning or error (--log-level wins)

    def __post_init__(self) -> None:
        if not self.data_dir:
            raise ConfigError("data_dir is required")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is not in 0..65535")
        try:
            check_rack(self.rack)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        positive = (
            "journal_buffered_writes_threshold",
            "journal_max_file_size",
            "entry_log_max_size",
            "entry_log_write_buffer",
            "flush_interval",
            "write_cache_max_size",
            "index_cache_size",
            "index_write_buffer_size",
            "ledger_state_cache_size",
            "max_frame_size",
            "max_inflight_per_connection",
            "max_long_poll_timeout",
            "registration_ttl",
            "max_connections",
            "connection_idle_timeout",
            "frame_timeout",
            "write_timeout",
            "disk_check_interval",
            "server_write_buffer_low_water_mark",
            "max_reads_in_progress",
            "max_long_polls",
            "max_long_polls_per_connection",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.advertised_address is not None:
            host, _sep, port = self.advertised_address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ConfigError(
                    f"advertised_address must be host:port, got {self.advertised_address!r}"
                )
        if not 0 <= self.gc_compaction_threshold < 1:
            raise ConfigError("gc_compaction_threshold must be in [0, 1)")
        if self.gc_interval < 0:
            raise ConfigError("gc_interval must not be negative (0 turns collection off)")
        if self.metadata_history_revisions < 0:
            raise ConfigError("metadata_history_revisions must not be negative (0: off)")
        if self.journal_max_group_wait < 0:
            raise ConfigError("journal_max_group_wait must not be negative")
        if self.journal_volatile_sync_delay < 0:
            raise ConfigError("journal_volatile_sync_delay must not be negative")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(
                f"log_level must be debug, info, warning or error, got {self.log_level!r}"
            )
        if not 1024 <= self.max_frame_size <= MAX_FRAME_SIZE:
            raise ConfigError(f"max_frame_size must be in 1024..{MAX_FRAME_SIZE} bytes")
        if self.server_write_buffer_high_water_mark <= self.server_write_buffer_low_water_mark:
            raise ConfigError(
                "server_write_buffer_high_water_mark must be above the low water mark"
            )
        if self.max_connection_memory < 2 * self.max_frame_size:
            raise ConfigError("max_connection_memory must hold at least two max_frame_size frames")
        if self.max_add_bytes_in_progress < self.max_frame_size:
            raise ConfigError("max_add_bytes_in_progress must hold at least one max_frame_size")
        if not (
            0 < self.disk_usage_lwm_threshold <= self.disk_usage_threshold <= 1
            and 0 < self.disk_usage_warn_threshold <= self.disk_usage_threshold
        ):
            raise ConfigError(
                "disk thresholds must satisfy 0 < disk_usage_lwm_threshold <= "
                "disk_usage_threshold <= 1 and 0 < disk_usage_warn_threshold <= "
                "disk_usage_threshold"
            )
        if self.read_cache_max_size < 0:
            raise ConfigError("read_cache_max_size must not be negative (0: no read cache)")
        if self.min_usable_size_for_high_priority_writes < 0 or self.disk_reserved_space < 0:
            raise ConfigError("disk sizes must not be negative")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("tls_cert_file and tls_key_file go together: give both or neither")
        if self.tls_cert_file is None and (self.tls_only or self.tls_client_auth):
            raise ConfigError("tls_only and tls_client_auth need tls_cert_file and tls_key_file")
        if self.tls_client_auth and self.tls_ca_file is None:
            raise ConfigError(
                "tls_client_auth needs tls_ca_file (what client certificates chain to)"
            )
        if self.tls_reload_interval < 0:
            raise ConfigError("tls_reload_interval must not be negative (0: never reload)")
        if self.entry_log_max_size > 1 << 40:
            raise ConfigError("entry_log_max_size cannot pass 1 TiB (locations hold 40 bits)")

    def __repr__(self) -> str:
        # The metadata URI may hold an etcd password: shown redacted (metadata.uri.redact_uri).
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "metadata_uri" and value:
                value = redact_uri(value)
            parts.append(f"{f.name}={value!r}")
        return f"BookieConfig({', '.join(parts)})"

    @property
    def tls_enabled(self) -> bool:
        """Whether the bookie offers TLS (it has a certificate and key)."""
        return self.tls_cert_file is not None

    @property
    def journal_path(self) -> str:
        """The journal's directory: ``journal_dir``, else ``DATA_DIR/journal``."""
        return self.journal_dir or os.path.join(self.data_dir, "journal")

    @property
    def ledgers_path(self) -> str:
        """Ledger storage's directory: ``DATA_DIR/ledgers``."""
        return os.path.join(self.data_dir, "ledgers")

    def with_changes(self, **changes: Any) -> BookieConfig:
        """A copy with ``changes`` applied (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_toml(cls, path: str, **overrides: Any) -> BookieConfig:
        """Read settings from a TOML file (flat keys, or under a ``[bookie]`` table), the
        autorecovery settings under ``[autorecovery]`` (``[bookie.autorecovery]``).

        Args:
            path: The file.
            **overrides: Settings that win over the file (typically flags; None means "not
                given").

        Returns:
            The settings.

        Raises:
            ConfigError: The file cannot be read or parsed, or holds an unknown or bad key.
        """
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        table = document.get("bookie", document)
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: [bookie] must be a table")
        return cls.from_mapping(table, source=path, **overrides)

    @classmethod
    def from_mapping(
        cls, table: dict[str, Any], source: str = "", **overrides: Any
    ) -> BookieConfig:
        """Settings from a mapping of keys to values, each type-checked.

        Args:
            table: The keys and values (a TOML table); the autorecovery settings under
                ``"autorecovery"`` (a table), or flat (deprecated: a ``FutureWarning`` each).
            source: Where they came from, for error messages.
            **overrides: Settings that win over ``table`` (None means "not given"); an
                autorecovery setting may be given flat, as its flag is named.

        Returns:
            The settings.

        Raises:
            ConfigError: An unknown key, a value of the wrong type, a bad setting, or an
                autorecovery setting given both flat and in its table.
        """
        where = source or "config"
        known = {f.name: f for f in dataclasses.fields(cls)}
        recovery = _autorecovery_settings(table, source)
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key == "autorecovery" or key in FLAT_AUTORECOVERY:
                continue
            if key in IGNORED:
                warnings.warn(
                    f"{where}: {key} is ignored ({IGNORED[key]}): remove it",
                    FutureWarning,
                    stacklevel=2,
                )
                continue
            setting = known.get(key)
            if setting is None:
                raise ConfigError(f"{where}: unknown setting {key!r}")
            values[key] = _check_type(key, value, setting.type, source)
        given = {k: v for k, v in overrides.items() if v is not None}
        if "autorecovery" in given:  # a whole AutoRecoveryConfig wins over the file's table
            recovery.clear()
        recovery.update({k: given.pop(k) for k in FLAT_AUTORECOVERY & given.keys()})
        values.update(given)
        try:
            base = values.get("autorecovery", AutoRecoveryConfig())
            values["autorecovery"] = dataclasses.replace(base, **recovery)
        except ValueError as exc:  # AutoRecoveryConfig's own check, said as the bookie's are
            raise ConfigError(f"{source}: {exc}" if source else str(exc)) from None
        except TypeError as exc:
            raise ConfigError(f"{where}: autorecovery: {exc}") from None
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _autorecovery_settings(table: dict[str, Any], source: str) -> dict[str, Any]:
    """The autorecovery settings a bookie's table holds, type-checked: its ``autorecovery``
    table, and flat keys (a ``FutureWarning`` each, naming the table's key)."""
    where = source or "config"
    nested = table.get("autorecovery", {})
    if not isinstance(nested, dict):
        raise ConfigError(f"{where}: autorecovery must be a table ([autorecovery])")
    found: dict[str, Any] = {}
    for key, value in nested.items():
        if key not in AUTORECOVERY_FIELDS:
            raise ConfigError(f"{where}: unknown setting 'autorecovery.{key}'")
        found[key] = value
    for key in FLAT_AUTORECOVERY & table.keys():
        if key in found:
            raise ConfigError(
                f"{where}: {key} is set both flat and under [autorecovery]: remove the flat one"
            )
        warnings.warn(
            f"{where}: the bookie setting {key!r} is deprecated: set it under "
            f"[autorecovery] (autorecovery.{key})",
            FutureWarning,
            stacklevel=3,
        )
        found[key] = table[key]
    return {
        key: _check_type(f"autorecovery.{key}", value, AUTORECOVERY_FIELDS[key].type, source)
        for key, value in found.items()
    }


def _check_type(key: str, value: Any, annotation: Any, source: str) -> Any:
    text = str(annotation)
    where = source or "config"
    if "bool" in text:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false")
        return value
    if "float" in text:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: {key} must be a number of seconds")
        return float(value)
    if "int" in text:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key} must be an integer")
        return value
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string")
    return value
