"""Prometheus exporters for the figures aiobk keeps: a bookie's (``--metrics-port``: its
``BookieStats`` counters and histograms, its gauges, the disk usage of its directories), an
autorecovery process's (``AutoRecoveryStats``), and a client's, on an application's own registry
(``register_client_metrics``). Every process that serves metrics also exports
``aiobk_build_info{version, python}`` (``register_build_info``) and its event loop's lag,
``aiobk_event_loop_lag_seconds`` (``register_loop_lag``, ``aiobk.loop_lag``); bookies and
autorecovery processes ``aiobk_metadata_connected`` (``MetadataCollector``).

The bookie, autorecovery and client keep plain figures; one collector reads them at scrape time
(from the exporter's thread), so the hot path pays an addition, or a ``bisect`` for a histogram,
and nothing else. Each figure becomes ``aiobk_<SUBSYSTEM>_<NAME>`` with one label naming the
process or client: a counter gets prometheus' ``_total`` suffix, a latency histogram
``_seconds``. Names follow BookKeeper's where one maps, in Prometheus' spelling (its
``bookie_ADD_ENTRY_REQUEST`` is ``aiobk_bookie_add_entry_request_seconds``, its
``bookie_journal_JOURNAL_SYNC`` ``aiobk_bookie_journal_sync_seconds``, its
``bookie_SERVER_STATUS`` the ``aiobk_bookie_writable`` gauge). Every figure has a one-line help
text (``BOOKIE_HELP``, ``AUTORECOVERY_HELP``, ``CLIENT_HELP``; a test checks that none is
missing). ``deploy/grafana/bookie-dashboard.json`` charts the bookie's,
``deploy/grafana/client-dashboard.json`` a client's.

The ``--metrics-port`` exporter is prometheus_client's WSGI app on a thread of its own, behind
a router of ours (``exporter_app``): prometheus_client's answers the exposition on any path, so
a typo in a scrape config, or a scanner, would get 200 and the figures. Ours answers
``/metrics``, a one-line landing page at ``/`` naming the process and that path (the Prometheus
exporters' convention: whoever opens the port by hand learns what it is; a scrape pointed at
``/`` fails to parse instead of working by accident), and 404 everywhere else.
"""

from __future__ import annotations

import contextlib
import platform
import shutil
import socket
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import make_wsgi_app
from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import CollectorRegistry

import aiobk
from aiobk.autorecovery import AutoRecoveryStats
from aiobk.bookie.stats import BookieStats
from aiobk.client import BookKeeper
from aiobk.loop_lag import LoopLag, loop_lag
from aiobk.metadata import MetadataStore

Figures = Callable[[], dict[str, int]]


class HistogramFigures(Protocol):
    """A histogram as the bookie and the client keep it (``aiobk.figures``)."""

    bounds: tuple[float, ...]
    counts: list[int]
    sum: float


Histograms = Callable[[], Mapping[str, HistogramFigures]]

# AutoRecoveryStats' figures that go up and down (the rest only ever grow). Named here rather
# than in the stats class, which stays free of exporting concerns.
AUTORECOVERY_GAUGES = frozenset(
    {
        "under_replicated_ledgers",
        "lost_ledgers",
        "lost_bookies",
        "bookies_registered",
        "bookies_writable",
        "bookies_readonly",
    }
)

# One line per figure, by its exported name without the prefix (and without a counter's
# _total); BookKeeper's name in brackets where one maps.
BOOKIE_HELP: dict[str, str] = {
    # counters
    "adds": "Add requests received, refused ones included [ADD_ENTRY].",
    "add_bytes": "Entry bytes of the add requests taken for the journal and ledger storage.",
    "add_batches": "ADD_BATCH requests received (protocol 2); each of their entries is an add.",
    "reads": "Read requests received, fencing reads and long polls included [READ_ENTRY].",
    "read_misses": "Reads of an entry this bookie does not have (ENOENTRY, or EUNKNOWN in limbo).",
    "long_polls": "Long-poll reads that waited for the ledger's LAC to move.",
    "fences": "Ledgers fenced on this bookie (a recovery's fencing read, or a boot's fence).",
    "bad_requests": "Requests that could not be decoded or were invalid (EBADREQ or a close).",
    "auth_failures": "Requests refused for a wrong master key (EUA).",
    "permission_denials": "Requests refused EPERM: TLS or a handshake first, or a missing role.",
    "tls_handshakes": "Connections upgraded to TLS (START_TLS).",
    "tls_handshake_failures": "TLS handshakes that failed (untrusted certificate, timeout).",
    "connections": "Client connections accepted.",
    "connections_refused": "Connections refused at max_connections with none idle to close.",
    "connections_evicted": "Idle connections closed to make room for a new one.",
    "connections_timed_out": "Connections closed for a frame, write or idle timeout.",
    "connections_shed": "Connections closed for holding the most when over max_connection_memory.",
    "add_pauses": "Times every connection stopped reading at max_add_bytes_in_progress.",
    "long_polls_refused": "Long polls answered ETOOMANYREQUESTS, over a long-poll cap.",
    "journal_records": "Records appended to the journal (adds, fences, keys, explicit LACs).",
    "journal_batches": "Journal writes, each one group commit of records.",
    "journal_syncs": "Journal fdatasyncs [JOURNAL_NUM_FORCE_WRITES].",
    "journal_bytes": "Bytes written to the journal, padding included [JOURNAL_WRITE_BYTES].",
    "journal_failures": "Times the journal stopped on a failed write or sync and had to recover.",
    "checkpoints": "Checkpoints completed (ledger storage durable, the journal trimmed).",
    "checkpoint_failures": "Checkpoint attempts that failed (each logged, then retried).",
    "journal_records_skipped": "Replayed journal records ledger storage could not keep (logged).",
    "entry_log_flushes": "Entry log buffers written to their files.",
    "storage_syncs": "Entry log fsyncs (checkpoints, FORCE on a journal-less bookie).",
    "corrupt_reads": "Stored entries or index blocks that failed their checksum (answered EIO).",
    "disk_full_errors": "Writes that met ENOSPC (each turns the bookie read-only).",
    "gc_forced": "Garbage collection passes forced by the disk usage warning threshold.",
    "adds_refused_read_only": "Adds answered EREADONLY while the bookie was read-only.",
    "gc_ledgers_deleted": "Deleted ledgers whose data garbage collection dropped.",
    "gc_logs_removed": "Entry log files garbage collection removed.",
    "gc_bytes_freed": "Disk bytes garbage collection freed.",
    "gc_entries_moved": "Live entries compaction copied out of mostly-dead entry logs.",
    "gc_logs_compacted": "Entry logs compaction emptied and removed.",
    "ledger_states_loaded": "Ledger states read back from the index (not in memory before).",
    "ledger_states_dropped": "Idle ledger states dropped from memory after a checkpoint.",
    "read_cache_hits": "Entry reads served from the read cache.",
    # gauges
    "writable": "1 while the bookie takes adds, 0 while read-only [SERVER_STATUS].",
    "high_priority_writes": "1 while recovery adds are still taken (room above the reserve).",
    "checkpoint_failing": "1 while the last checkpoint failed and none has worked since.",
    "journal_failed": "1 while the journal is stopped after a failed write or sync.",
    "connections_open": "Client connections open now.",
    "connection_bytes_held": "Bytes connections hold now (partial frames, unsent responses).",
    "add_bytes_in_progress": "Entry bytes of adds received and not answered yet.",
    "long_polls_waiting": "Long polls waiting now.",
    "journal_queue_size": "Journal records appended and not written yet [JOURNAL_QUEUE_SIZE].",
    "journal_force_write_queue_size": (
        "Journal batches written and waiting for an fdatasync [JOURNAL_FORCE_WRITE_QUEUE_SIZE]."
    ),
    "ledgers_held": "Ledgers this bookie holds data or state for [NUM_OPEN_LEDGERS].",
    "ledger_states_in_use": "Ledger states loaded in memory now.",
    "write_cache_bytes": "Bytes of entry locations held since the last checkpoint [write_cache].",
    "write_cache_max_bytes": "Write cache size that starts a checkpoint (write_cache_max_size).",
    "read_cache_bytes": "Bytes of recently read entries cached [read_cache_size].",
    "read_cache_max_bytes": "Read cache capacity in bytes (read_cache_max_size).",
    "disk_free_bytes": "Bytes free on the filesystem of a bookie directory (label dir).",
    "disk_total_bytes": "Size in bytes of the filesystem of a bookie directory (label dir).",
    # histograms
    "add_entry_request_seconds": (
        "Add latency, from handling the request to queuing its answer [ADD_ENTRY_REQUEST]."
    ),
    "read_entry_seconds": (
        "Read latency (long polls aside), from handling the request to its answer [READ_ENTRY]."
    ),
    "read_entry_long_poll_wait_seconds": (
        "How long long polls waited for the LAC to move or their timeout "
        "[READ_ENTRY_LONG_POLL_WAIT]."
    ),
    "journal_flush_seconds": (
        "Journal write latency, a batch written apart from its fdatasync (an idle journal "
        "writes and syncs a lone small record in one call, timed as a sync) "
        "[JOURNAL_FLUSH_LATENCY]."
    ),
    "journal_sync_seconds": "Journal fdatasync latency (with the write, when one call does both) "
    "[JOURNAL_SYNC].",
    "journal_batch_entries": (
        "Records per journal write (group commit) [JOURNAL_FORCE_WRITE_BATCH_ENTRIES]."
    ),
    "journal_batch_bytes": (
        "Bytes per journal write (group commit) [JOURNAL_FORCE_WRITE_BATCH_BYTES]."
    ),
}

AUTORECOVERY_HELP: dict[str, str] = {
    "auditor_elections": "Times this process became the auditor.",
    "ledgers_marked": "Under-replicated marks this process's auditor made or widened.",
    "marks_cleared": "Marks dropped because their bookie came back or their ledger was deleted.",
    "ledgers_checked": "Ledgers the periodic check asked bookies about.",
    "under_replicated_ledgers": "Ledgers marked under-replicated and waiting for repair "
    "(the auditor's count).",
    "lost_ledgers": "Marked ledgers with entries no bookie has (the auditor's count).",
    "lost_bookies": "Bookies the auditor holds lost.",
    "bookies_registered": "Bookies registered (live), writable or read-only, as the auditor "
    "last read the registry.",
    "bookies_writable": "Writable bookies registered, as the auditor last read the registry.",
    "bookies_readonly": "Read-only bookies registered, as the auditor last read the registry.",
    "ledgers_repaired": "Under-replicated marks this process's workers resolved.",
    "fragments_replicated": "Fragment copies this process's workers moved to a new bookie.",
    "entries_replicated": "Entries this process's workers copied to a new bookie.",
    "bytes_replicated": "Entry bytes this process's workers copied to a new bookie.",
    "ledgers_recovered": "Open ledgers a worker fenced and closed after the grace period.",
    "repair_failures": "Repairs that stopped (each retried after a backoff).",
}

CLIENT_HELP: dict[str, str] = {
    "appends": "Appends confirmed to their caller.",
    "append_bytes": "Payload bytes of the appends confirmed.",
    "append_failures": "Appends failed (a fenced or closed ledger, a failed ensemble change, ...).",
    "ensemble_changes": "New fragments this client's writers put in the metadata "
    "[NUM_ENSEMBLE_CHANGE].",
    "recoveries": "Ledgers this client recovered (or found closed) when opening them.",
    "recovery_failures": "Ledger recoveries that failed (LedgerRecoveryError and others).",
    "entries_read": "Entries read and verified.",
    "speculative_reads": "Reads that asked a next bookie because the first was slow "
    "[SPECULATIVE_READ_COUNT].",
    "pending_appends": "Appends started and not finished yet [NUM_PENDING_ADD].",
    "pending_append_bytes": "Payload bytes of the appends started and not finished yet.",
    "appends_waiting": "Appends waiting for room in the client's budget of unfinished appends.",
    "append_seconds": "Append latency, from the entry id given to the confirmation [ADD_ENTRY].",
}


def histogram_name(field: str) -> str:
    """The exported name of a histogram field: a duration gets ``_seconds``."""
    return field if field.endswith(("_entries", "_bytes")) else f"{field}_seconds"


def _buckets(histogram: HistogramFigures) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets ending with +Inf, from one copy of the counts, and the sum."""
    counts = list(histogram.counts)  # the loop thread records meanwhile: one consistent copy
    total = histogram.sum
    running = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip((*histogram.bounds, float("inf")), counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
    return buckets, total


class FiguresCollector:
    """Counters, gauges and histograms of one process (or client), read at scrape time."""

    def __init__(
        self,
        subsystem: str,
        label: str,
        value: str,
        counters: Figures,
        gauges: Figures | None = None,
        histograms: Histograms | None = None,
        help_texts: Mapping[str, str] | None = None,
        extra_labels: Mapping[str, str] | None = None,
    ) -> None:
        self._subsystem = subsystem
        self._labels = [label, *(extra_labels or {})]
        self._values = [value, *(extra_labels or {}).values()]
        self._counters = counters
        self._gauges = gauges
        self._histograms = histograms
        self._help = help_texts or {}

    def _doc(self, name: str, kind: str) -> str:
        return self._help.get(name) or f"{self._subsystem} {kind} {name}"

    def collect(self) -> Iterator[Any]:
        prefix = f"aiobk_{self._subsystem}"
        labels, values = self._labels, self._values
        for name, value in self._counters().items():
            family = CounterMetricFamily(
                f"{prefix}_{name}", self._doc(name, "counter"), labels=labels
            )
            family.add_metric(values, value)
            yield family
        for name, value in (self._gauges() if self._gauges is not None else {}).items():
            gauge = GaugeMetricFamily(f"{prefix}_{name}", self._doc(name, "gauge"), labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        for name, histogram in (self._histograms() if self._histograms else {}).items():
            distribution = HistogramMetricFamily(
                f"{prefix}_{name}", self._doc(name, "histogram"), labels=labels
            )
            buckets, total = _buckets(histogram)
            distribution.add_metric(values, buckets, total)
            yield distribution


class DiskCollector:
    """Free and total bytes of the filesystem of each bookie directory (``dir`` label),
    measured at scrape time on the exporter's thread (never on the event loop)."""

    def __init__(self, bookie_id: str, directories: Callable[[], Iterable[str]]) -> None:
        self._bookie_id = bookie_id
        self._directories = directories

    def collect(self) -> Iterator[Any]:
        labels = ["bookie", "dir"]
        free = GaugeMetricFamily(
            "aiobk_bookie_disk_free_bytes", BOOKIE_HELP["disk_free_bytes"], labels=labels
        )
        total = GaugeMetricFamily(
            "aiobk_bookie_disk_total_bytes", BOOKIE_HELP["disk_total_bytes"], labels=labels
        )
        for path in self._directories():
            try:
                usage = shutil.disk_usage(path)
            except OSError:
                continue  # not made yet, or its disk is gone: nothing to say about it
            free.add_metric([self._bookie_id, path], usage.free)
            total.add_metric([self._bookie_id, path], usage.total)
        yield free
        yield total


BUILD_INFO_HELP = "The aiobk version and Python version of this process (always 1)."


class BuildInfoCollector:
    """``aiobk_build_info{version, python} 1``: what a process runs, for a dashboard to show
    and an alert to compare across the cluster (Prometheus' ``*_build_info`` convention)."""

    def collect(self) -> Iterator[Any]:
        info = GaugeMetricFamily("aiobk_build_info", BUILD_INFO_HELP, labels=["version", "python"])
        info.add_metric([aiobk.__version__, platform.python_version()], 1)
        yield info


_build_info_lock = threading.Lock()
_build_info_on: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def register_build_info(registry: CollectorRegistry = REGISTRY) -> None:
    """Put ``aiobk_build_info`` on ``registry`` once (every process that serves metrics: each
    bookie of a standalone cluster asks for it on the same registry)."""
    with _build_info_lock:
        if registry not in _build_info_on:
            registry.register(BuildInfoCollector())
            _build_info_on.add(registry)


LOOP_LAG_HELP = (
    "How much later than scheduled the event loop woke a task sleeping 0.5 s (the loop's clock)."
)
METADATA_CONNECTED_HELP = (
    "1 while the last call to the metadata store (etcd) got through, 0 after one that could not."
)


class LoopLagCollector:
    """``aiobk_event_loop_lag_seconds``: the lag histogram of the process's loop
    (``aiobk.loop_lag``)."""

    def __init__(self, monitor: LoopLag) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Any]:
        family = HistogramMetricFamily("aiobk_event_loop_lag_seconds", LOOP_LAG_HELP)
        buckets, total = _buckets(self.monitor.histogram)
        family.add_metric([], buckets, total)
        yield family


_loop_lag_on: weakref.WeakKeyDictionary[CollectorRegistry, LoopLagCollector] = (
    weakref.WeakKeyDictionary()
)


def register_loop_lag(registry: CollectorRegistry = REGISTRY) -> LoopLagCollector:
    """Measure the running loop's lag and put ``aiobk_event_loop_lag_seconds`` on ``registry``
    (once: the bookies of a standalone cluster and the clients of one application share a
    loop). Called on the loop's thread."""
    monitor = loop_lag()
    with _build_info_lock:
        collector = _loop_lag_on.get(registry)
        if collector is None:
            collector = _loop_lag_on[registry] = LoopLagCollector(monitor)
            registry.register(collector)
        collector.monitor = monitor  # a later loop of the same process (tests) takes over
    return collector


class MetadataCollector:
    """``aiobk_metadata_connected{...} 1|0``: whether a process's metadata store answers
    (``KV.connected``), with the process's labels (a bookie's, an autorecovery's)."""

    def __init__(self, store: Callable[[], MetadataStore | None], labels: Mapping[str, str]):
        self._store = store
        self._labels = dict(labels)

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "aiobk_metadata_connected", METADATA_CONNECTED_HELP, labels=list(self._labels)
        )
        store = self._store()
        if store is not None:
            family.add_metric(list(self._labels.values()), int(store.kv.connected))
        yield family


def _split(figures: Figures, gauge_names: Collection[str]) -> tuple[Figures, Figures]:
    """One source of figures as two: the counters, and the gauges among them."""

    def counters() -> dict[str, int]:
        return {k: v for k, v in figures().items() if k not in gauge_names}

    def gauges() -> dict[str, int]:
        return {k: v for k, v in figures().items() if k in gauge_names}

    return counters, gauges


def bookie_collectors(
    stats: BookieStats,
    bookie_id: str,
    gauges: Figures | None = None,
    store: Callable[[], MetadataStore | None] | None = None,
) -> list[Any]:
    """The collectors of a bookie's figures (``aiobk_bookie_*{bookie=...}``), for a registry of
    the caller's choosing: counters, gauges and histograms, and its directories' disk usage.
    From now on the bookie's histograms are timed by ``time.monotonic``, at full resolution
    (``bookie.stats``: uvloop's loop clock counts whole milliseconds)."""
    stats.clock = time.monotonic

    def histograms() -> dict[str, HistogramFigures]:
        return {histogram_name(k): h for k, h in stats.histograms.as_dict().items()}

    figures = FiguresCollector(
        "bookie", "bookie", bookie_id, stats.as_dict, gauges, histograms, BOOKIE_HELP
    )
    collectors: list[Any] = [figures, DiskCollector(bookie_id, lambda: stats.directories)]
    if store is not None:
        collectors.append(MetadataCollector(store, {"bookie": bookie_id}))
    return collectors


METRICS_PATH = "/metrics"


def _text() -> list[tuple[str, str]]:
    """Headers of a plain-text answer: a new list each time (wsgiref adds Content-Length to
    the list it is given)."""
    return [("Content-Type", "text/plain; charset=utf-8")]


def exporter_app(registry: CollectorRegistry, title: str) -> WSGIApplication:
    """prometheus_client's app for ``/metrics`` only (see the module doc); ``title`` names the
    process on the landing page at ``/``."""
    metrics = make_wsgi_app(registry)
    landing = f"{title}: Prometheus metrics at {METRICS_PATH}\n".encode()

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == METRICS_PATH:
            answer: Iterable[bytes] = metrics(environ, start_response)
            return answer
        if path != "/":
            start_response("404 Not Found", _text())
            return [f"no such path: {path}; the metrics are at {METRICS_PATH}\n".encode()]
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [*_text(), ("Allow", "GET")])
            return [b"use GET\n"]
        start_response("200 OK", _text())
        return [landing]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access line on stderr per scrape."""


def start_exporter(
    host: str, port: int, title: str, registry: CollectorRegistry = REGISTRY
) -> WSGIServer:
    """Serve ``registry`` on ``host:port`` (0: a free port, ``server_port`` says which) from a
    daemon thread; OSError when the port cannot be bound. ``shutdown()`` then
    ``server_close()`` stop it (a process's exporter lives as long as the process)."""
    family, _type, _proto, _name, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(ThreadingWSGIServer):
        address_family = family  # IPv6 hosts too (socketserver binds AF_INET by default)

    server = make_server(
        str(address[0]), port, exporter_app(registry, title), Server, _QuietHandler
    )
    thread = threading.Thread(
        target=server.serve_forever, name=f"metrics-exporter:{server.server_port}", daemon=True
    )
    thread.start()
    return server


def _serve(collectors: Iterable[Any], host: str, port: int, title: str) -> None:
    """Bind the exporter first: a port in use fails here (OSError) before anything registers.
    Called on the process's loop (its lag is measured from now)."""
    start_exporter(host, port, title)
    register_build_info()
    register_loop_lag()
    for collector in collectors:
        REGISTRY.register(collector)


def serve_metrics(
    stats: BookieStats,
    bookie_id: str,
    host: str,
    port: int,
    gauges: Figures | None = None,
    store: Callable[[], MetadataStore | None] | None = None,
) -> None:
    """Start a bookie's exporter thread (it lives as long as the process). ``gauges`` is read
    at scrape time too (writable, bytes held, ...); ``store`` the bookie's metadata store, for
    ``aiobk_metadata_connected``."""
    _serve(
        bookie_collectors(stats, bookie_id, gauges, store), host, port, f"aiobk bookie {bookie_id}"
    )


def autorecovery_collector(stats: AutoRecoveryStats, node_id: str) -> FiguresCollector:
    """A collector of an autorecovery process's figures
    (``aiobk_autorecovery_*{node=..., bookie=...}``), for a registry of the caller's choosing
    (a bookie's exporter may add it beside its own). ``bookie`` is the same id as ``node``:
    the bookie it runs beside, or the name of an ``aiobk autorecovery start`` process -- so
    that one ``bookie=`` selector finds a bookie's figures and its autorecovery's; ``node``
    stays for the dashboards and alerts written against it."""
    counters, gauges = _split(stats.as_dict, AUTORECOVERY_GAUGES)
    return FiguresCollector(
        "autorecovery",
        "node",
        node_id,
        counters,
        gauges,
        help_texts=AUTORECOVERY_HELP,
        extra_labels={"bookie": node_id},
    )


def add_autorecovery_metrics(stats: AutoRecoveryStats, node_id: str) -> None:
    """Export an autorecovery service's figures beside the process's others (a bookie's
    exporter, once started, also serves the autorecovery running beside the bookie)."""
    REGISTRY.register(autorecovery_collector(stats, node_id))


def serve_autorecovery_metrics(
    stats: AutoRecoveryStats,
    node_id: str,
    host: str,
    port: int,
    store: MetadataStore | None = None,
) -> None:
    """Start the exporter of ``aiobk autorecovery start`` (lives as long as the process);
    ``store`` its metadata store, for ``aiobk_metadata_connected``."""
    collectors: list[Any] = [autorecovery_collector(stats, node_id)]
    if store is not None:
        labels = {"node": node_id, "bookie": node_id}
        collectors.append(MetadataCollector(lambda: store, labels))
    _serve(collectors, host, port, f"aiobk autorecovery {node_id}")


def client_collector(bk: BookKeeper, name: str = "aiobk") -> FiguresCollector:
    """A collector of a client's figures (``aiobk_client_*{client=NAME}``): its counters,
    ``append_seconds`` and, read from its budget of unfinished appends, ``pending_appends``,
    ``pending_append_bytes`` and ``appends_waiting``. From now on the client's append latency
    is timed by ``time.monotonic``, at full resolution."""
    stats, budget = bk.stats, bk.add_budget
    stats.clock = time.monotonic

    def gauges() -> dict[str, int]:
        return {
            "pending_appends": budget.adds,
            "pending_append_bytes": budget.bytes,
            "appends_waiting": budget.waiting,
        }

    def histograms() -> dict[str, HistogramFigures]:
        return {"append_seconds": stats.append_latency}

    return FiguresCollector(
        "client", "client", name, stats.as_dict, gauges, histograms, CLIENT_HELP
    )


def register_client_metrics(
    bk: BookKeeper, registry: CollectorRegistry = REGISTRY, name: str = "aiobk"
) -> FiguresCollector:
    """Export client ``bk``'s figures on ``registry`` (the application's; prometheus_client's
    default one unless told), labelled ``client=name`` -- give each client of one registry its
    own name. Returns the collector (``registry.unregister`` it when the client is closed).
    Called on the client's loop, it also measures that loop's lag, exported once per registry
    as ``aiobk_event_loop_lag_seconds`` (``register_loop_lag``)."""
    collector = client_collector(bk, name)
    registry.register(collector)
    with contextlib.suppress(RuntimeError):  # no running loop: no loop to measure
        register_loop_lag(registry)
    return collector


__all__ = [
    "AUTORECOVERY_GAUGES",
    "AUTORECOVERY_HELP",
    "BOOKIE_HELP",
    "BUILD_INFO_HELP",
    "CLIENT_HELP",
    "LOOP_LAG_HELP",
    "METADATA_CONNECTED_HELP",
    "METRICS_PATH",
    "BuildInfoCollector",
    "DiskCollector",
    "FiguresCollector",
    "LoopLagCollector",
    "MetadataCollector",
    "add_autorecovery_metrics",
    "autorecovery_collector",
    "bookie_collectors",
    "client_collector",
    "exporter_app",
    "histogram_name",
    "register_build_info",
    "register_client_metrics",
    "register_loop_lag",
    "serve_autorecovery_metrics",
    "serve_metrics",
    "start_exporter",
]
