"""Prometheus exporters for the counters aiobk's processes keep (``--metrics-port``): a bookie's
(``BookieStats`` and its gauges) and an autorecovery process's (``AutoRecoveryStats``).

The processes keep plain integer figures; one collector reads them at scrape time, so the hot
path pays nothing for metrics. Each figure becomes ``aiobk_<SUBSYSTEM>_<NAME>`` with one label
naming the process (a counter gets prometheus' ``_total`` suffix).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily

from aiobk.autorecovery import AutoRecoveryStats
from aiobk.bookie.stats import BookieStats

Figures = Callable[[], dict[str, int]]

# AutoRecoveryStats' figures that go up and down (the rest only ever grow). Named here rather
# than in the stats class, which stays free of exporting concerns.
AUTORECOVERY_GAUGES = frozenset({"under_replicated_ledgers", "lost_ledgers", "lost_bookies"})


class FiguresCollector:
    """Counters and gauges of one process, read at scrape time."""

    def __init__(
        self,
        subsystem: str,
        label: str,
        value: str,
        counters: Figures,
        gauges: Figures | None = None,
    ) -> None:
        self._subsystem = subsystem
        self._label = label
        self._value = value
        self._counters = counters
        self._gauges = gauges

    def collect(self) -> Iterator[Any]:
        prefix = f"aiobk_{self._subsystem}"
        for name, value in self._counters().items():
            family = CounterMetricFamily(
                f"{prefix}_{name}", f"{self._subsystem} counter {name}", labels=[self._label]
            )
            family.add_metric([self._value], value)
            yield family
        for name, value in (self._gauges() if self._gauges is not None else {}).items():
            gauge = GaugeMetricFamily(
                f"{prefix}_{name}", f"{self._subsystem} gauge {name}", labels=[self._label]
            )
            gauge.add_metric([self._value], value)
            yield gauge


def _split(figures: Figures, gauge_names: Collection[str]) -> tuple[Figures, Figures]:
    """One source of figures as two: the counters, and the gauges among them."""

    def counters() -> dict[str, int]:
        return {k: v for k, v in figures().items() if k not in gauge_names}

    def gauges() -> dict[str, int]:
        return {k: v for k, v in figures().items() if k in gauge_names}

    return counters, gauges


def _serve(collector: FiguresCollector, host: str, port: int) -> None:
    """Bind the exporter first: a port in use fails here (OSError) before anything registers."""
    start_http_server(port, addr=host)
    REGISTRY.register(collector)


def serve_metrics(
    stats: BookieStats,
    bookie_id: str,
    host: str,
    port: int,
    gauges: Figures | None = None,
) -> None:
    """Start a bookie's exporter thread (it lives as long as the process). ``gauges`` is read
    at scrape time too (writable, bytes held, ...)."""
    _serve(FiguresCollector("bookie", "bookie", bookie_id, stats.as_dict, gauges), host, port)


def autorecovery_collector(stats: AutoRecoveryStats, node_id: str) -> FiguresCollector:
    """A collector of an autorecovery process's figures (``aiobk_autorecovery_*{node=...}``),
    for a registry of the caller's choosing (a bookie's exporter may add it beside its own)."""
    counters, gauges = _split(stats.as_dict, AUTORECOVERY_GAUGES)
    return FiguresCollector("autorecovery", "node", node_id, counters, gauges)


def add_autorecovery_metrics(stats: AutoRecoveryStats, node_id: str) -> None:
    """Export an autorecovery service's figures beside the process's others (a bookie's
    exporter, once started, also serves the autorecovery running beside the bookie)."""
    REGISTRY.register(autorecovery_collector(stats, node_id))


def serve_autorecovery_metrics(
    stats: AutoRecoveryStats, node_id: str, host: str, port: int
) -> None:
    """Start the exporter of ``aiobk autorecovery start`` (lives as long as the process)."""
    _serve(autorecovery_collector(stats, node_id), host, port)


__all__ = [
    "AUTORECOVERY_GAUGES",
    "FiguresCollector",
    "add_autorecovery_metrics",
    "autorecovery_collector",
    "serve_autorecovery_metrics",
    "serve_metrics",
]
