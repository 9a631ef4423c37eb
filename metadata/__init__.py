"""Ledger metadata and the stores that hold it (etcd, memory). Neither the client nor the bookie
touches etcd except through ``MetadataStore``.

Offloading's metadata: a ledger's ``OffloadRecord`` (``LedgerMetadata.offload``, its
``OffloadState``), a log's ``OffloadPolicy`` (``LogMetadata.offload_policy``), and the
cluster's ``OffloadStoreSettings`` with the work list of offloaded ledgers, both kept by
``MetadataStore``."""

from aiobk.metadata.autorecovery import (
    CHECK,
    DECOMMISSION,
    LOST_BOOKIE,
    PLACEMENT,
    AuditorStatus,
    AutoRecoveryStore,
    RepairAttempt,
    UnderReplication,
)
from aiobk.metadata.etcd_process import EtcdNotFoundError, EtcdProcess, free_port
from aiobk.metadata.etcd_security import EtcdServerTLS
from aiobk.metadata.keys import KeyLayout
from aiobk.metadata.kv import (
    KV,
    KeyValue,
    MetadataAuthError,
    MetadataPermissionError,
    Watch,
    WatchEvent,
)
from aiobk.metadata.kv_memory import MemoryKV
from aiobk.metadata.lease import HeldLease
from aiobk.metadata.model import (
    Fragment,
    LedgerMetadata,
    LedgerState,
    MetadataFormatError,
    OffloadRecord,
    OffloadState,
    write_set,
)
from aiobk.metadata.records import (
    DEFAULT_RACK,
    READ_ONLY,
    WRITABLE,
    BookieServiceInfo,
    ClusterRecord,
    Cookie,
    LogMetadata,
    OffloadPolicy,
    OffloadStoreSettings,
    ProducerState,
    check_rack,
    zone_of,
)
from aiobk.metadata.registration import Registration
from aiobk.metadata.store import DEFAULT_BOOKIE_TTL, MetadataStore
from aiobk.metadata.uri import DEFAULT_TIMEOUT, MetadataURIError, open_store, redact_uri

__all__ = [
    "DEFAULT_RACK",
    "CHECK",
    "DECOMMISSION",
    "LOST_BOOKIE",
    "PLACEMENT",
    "AuditorStatus",
    "AutoRecoveryStore",
    "HeldLease",
    "RepairAttempt",
    "UnderReplication",
    "DEFAULT_BOOKIE_TTL",
    "DEFAULT_TIMEOUT",
    "READ_ONLY",
    "WRITABLE",
    "BookieServiceInfo",
    "ClusterRecord",
    "Cookie",
    "EtcdNotFoundError",
    "EtcdProcess",
    "EtcdServerTLS",
    "Fragment",
    "KV",
    "KeyLayout",
    "KeyValue",
    "LedgerMetadata",
    "LedgerState",
    "LogMetadata",
    "OffloadPolicy",
    "OffloadRecord",
    "OffloadState",
    "OffloadStoreSettings",
    "ProducerState",
    "check_rack",
    "zone_of",
    "MemoryKV",
    "MetadataAuthError",
    "MetadataFormatError",
    "MetadataPermissionError",
    "MetadataStore",
    "MetadataURIError",
    "Registration",
    "Watch",
    "WatchEvent",
    "free_port",
    "open_store",
    "redact_uri",
    "write_set",
]
