"""Prometheus exporter for a bookie's counters (``--metrics-port``).

The bookie keeps plain integer counters; this collector reads them at scrape time, so the hot
path pays nothing for metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily

from aiobk.bookie.stats import BookieStats


class _StatsCollector:
    def __init__(
        self,
        stats: BookieStats,
        bookie_id: str,
        gauges: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self._stats = stats
        self._bookie_id = bookie_id
        self._gauges = gauges

    def collect(self) -> Iterator[Any]:
        for name, value in self._stats.as_dict().items():
            family = CounterMetricFamily(
                f"aiobk_bookie_{name}", f"bookie counter {name}", labels=["bookie"]
            )
            family.add_metric([self._bookie_id], value)
            yield family
        for name, value in (self._gauges() if self._gauges is not None else {}).items():
            gauge = GaugeMetricFamily(
                f"aiobk_bookie_{name}", f"bookie gauge {name}", labels=["bookie"]
            )
            gauge.add_metric([self._bookie_id], value)
            yield gauge


def serve_metrics(
    stats: BookieStats,
    bookie_id: str,
    host: str,
    port: int,
    gauges: Callable[[], dict[str, int]] | None = None,
) -> None:
    """Start the exporter thread (it lives as long as the process). ``gauges`` is read at
    scrape time too (writable, bytes held, ...)."""
    REGISTRY.register(_StatsCollector(stats, bookie_id, gauges))
    start_http_server(port, addr=host)
