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
text (``BOOKIE_HELP``, ``AUTORECOVERY_HELP``, ``CLIENT_HELP``, in ``aiobk.metrics.help_texts``;
a test checks that none is missing). ``deploy/grafana/bookie-dashboard.json`` charts the bookie's,
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
from aiobk.metrics.help_texts import (
    AUTORECOVERY_GAUGES,
    AUTORECOVERY_HELP,
    BOOKIE_HELP,
    BUILD_INFO_HELP,
    CLIENT_HELP,
    LOOP_LAG_HELP,
    METADATA_CONNECTED_HELP,
)

Figures = Callable[[], dict[str, int]]


class HistogramFigures(Protocol):
    """A histogram as the bookie and the client keep it (``aiobk.figures``)."""

    bounds: tuple[float, ...]
    counts: list[int]
    sum: float


Histograms = Callable[[], Mapping[str, HistogramFigures]]


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
