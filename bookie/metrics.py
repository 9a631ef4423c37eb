"""Prometheus exporter for a bookie's counters (``--metrics-port``).

The bookie keeps plain integer counters; this collector reads them at scrape time, so the hot
path pays nothing for metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily

from bookie.stats import BookieStats


class _StatsCollector:
    def __init__(self, stats: BookieStats, bookie_id: str) -> None:
        self._stats = stats
        self._bookie_id = bookie_id

    def collect(self) -> Iterator[Any]:
        for name, value in self._stats.as_dict().items():
            family = CounterMetricFamily(
                f"aiobk_bookie_{name}", f"bookie counter {name}", labels=["bookie"]
            )
            family.add_metric([self._bookie_id], value)
            yield family


def serve_metrics(stats: BookieStats, bookie_id: str, host: str, port: int) -> None:
    """Start the exporter thread (it lives as long as the process)."""
    REGISTRY.register(_StatsCollector(stats, bookie_id))
    start_http_server(port, addr=host)
