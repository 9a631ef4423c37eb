"""The bookie's exporter, metrics worth scraping: every figure has a help text of
its own; a bookie process serves latency histograms that fill as it works, its gauges and its
directories' disk usage, at ``/metrics`` only (a landing page at ``/``, 404 elsewhere); the
Grafana dashboard charts only what the exporter serves."""

from __future__ import annotations

import asyncio
import json
import math
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.process_collector import ProcessCollector

from aiobk.autorecovery import AutoRecoveryStats
from aiobk.bookie import Bookie, BookieConfig
from aiobk.bookie.stats import BookieStats
from aiobk.client import BookKeeper, ClientConfig
from aiobk.client.stats import ClientStats
from aiobk.metadata import EtcdProcess, free_port, open_store
from aiobk.metrics import (
    AUTORECOVERY_HELP,
    BOOKIE_HELP,
    CLIENT_HELP,
    MetadataCollector,
    autorecovery_collector,
    bookie_collectors,
    histogram_name,
    register_loop_lag,
    start_exporter,
)
from aiobk.protocol.errors import MetadataStoreError
from tests.conftest import BookieFactory
from tests.support.names import unique_name
from tests.support.procs import BookieProcess

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "bookie-dashboard.json"
GENERIC = re.compile(r"(bookie|autorecovery|client) (counter|gauge|histogram) \w+")
METRIC = re.compile(r"\b(?:aiobk|process)_[a-z_]+\b")
ADDS = 40
PAYLOAD = b"m" * 100


def dashboard_metrics() -> set[str]:
    """Every metric name a query of the dashboard uses."""
    board = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            names.update(METRIC.findall(target["expr"]))
    for variable in board["templating"]["list"]:
        names.update(METRIC.findall(variable.get("definition", "")))
    return names


def sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def check_help(text: str) -> None:
    """Every aiobk family says what it is, in words of its own."""
    seen: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("aiobk_"):
            doc = family.documentation
            assert doc, family.name
            assert not GENERIC.fullmatch(doc), (family.name, doc)
            assert "\n" not in doc, family.name
            assert seen.setdefault(doc, family.name) == family.name, (family.name, doc)


@pytest.mark.timeout(10)
def test_every_figure_has_a_help_text_and_no_help_text_is_stale(tmp_path: Path) -> None:
    bookie = Bookie(BookieConfig(data_dir=str(tmp_path / "b")))
    stats = BookieStats()
    served = (
        set(stats.as_dict())
        | set(bookie.gauges())
        | {histogram_name(name) for name in stats.histograms.as_dict()}
        | {"disk_free_bytes", "disk_total_bytes"}
    )
    assert served == set(BOOKIE_HELP)
    assert set(AutoRecoveryStats().as_dict()) == set(AUTORECOVERY_HELP)
    client = set(ClientStats().as_dict()) | {
        "pending_appends",
        "pending_append_bytes",
        "appends_waiting",
        "append_seconds",
    }
    assert client == set(CLIENT_HELP)
    for helps in (BOOKIE_HELP, AUTORECOVERY_HELP, CLIENT_HELP):
        for name, doc in helps.items():
            assert doc.endswith((".", ")")), name
            assert "\n" not in doc, name
            assert not GENERIC.fullmatch(doc), name
        assert len(set(helps.values())) == len(helps)


@pytest.mark.timeout(30)
async def test_the_dashboard_charts_only_what_the_exporter_serves(
    start_bookie: BookieFactory,
) -> None:
    """The collectors a bookie process's exporter registers (serve_metrics, plus the
    autorecovery beside it and prometheus_client's process figures), on a registry of our own,
    against every metric name the dashboard's queries and variables use."""
    bookie = await start_bookie()
    registry = CollectorRegistry()
    store = open_store(f"memory://{unique_name('dashboard')}")  # as a bookie with its store
    collectors = bookie_collectors(bookie.stats, bookie.bookie_id, bookie.gauges, lambda: store)
    for collector in collectors:
        registry.register(collector)
    registry.register(autorecovery_collector(AutoRecoveryStats(), bookie.bookie_id))
    register_loop_lag(registry)
    ProcessCollector(registry=registry)
    text = generate_latest(registry).decode()
    check_help(text)
    served = sample_names(text)
    used = dashboard_metrics()
    assert used, "the dashboard names no metric"
    assert used <= served, sorted(used - served)
    board = json.loads(DASHBOARD.read_text())
    assert {p["id"] for p in board["panels"]} == set(range(1, len(board["panels"]) + 1))


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _one(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> float:
    found = [v for (n, _labels), v in samples.items() if n == name]
    assert len(found) == 1, (name, found)
    return found[0]


def _buckets(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str
) -> list[tuple[float, float]]:
    out = []
    for (n, labels), value in samples.items():
        if n == f"{name}_bucket":
            out.append((float(dict(labels)["le"]), value))
    return sorted(out)


def check_histogram(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str
) -> tuple[float, float]:
    """(count, sum), once the buckets are checked: cumulative, ending at +Inf with the count."""
    buckets = _buckets(samples, name)
    assert len(buckets) == 26 or name.endswith(("_entries", "_bytes")), (name, len(buckets))
    counts = [c for _le, c in buckets]
    assert counts == sorted(counts), name
    assert buckets[-1][0] == math.inf
    count, total = _one(samples, f"{name}_count"), _one(samples, f"{name}_sum")
    assert buckets[-1][1] == count, name
    return count, total


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return bytes(answer.read()).decode()


def _fetch(url: str, method: str = "GET") -> tuple[int, str, str]:
    """(status, content type, body), errors included."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], bytes(answer.read()).decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], bytes(error.read()).decode()


ELSEWHERE = [
    "/nope",
    "/api/x",
    "/metrics/",
    "/metricsx",
    "/favicon.ico",
    "/index.html",
    "/metrics.txt",
]


def check_routes(base: str, title: str) -> None:
    """``/metrics`` is the exposition, ``/`` a page saying so, any other path 404 (before:
    prometheus_client's exporter answered every path with the figures)."""
    status, kind, text = _fetch(base + "/metrics")
    assert (status, kind.split(";")[0]) == (200, "text/plain"), text
    assert "# TYPE aiobk_" in text
    status, kind, landing = _fetch(base + "/")
    assert (status, landing) == (200, f"{title}: Prometheus metrics at /metrics\n")
    for path in ELSEWHERE:
        for method in ("GET", "POST"):
            status, kind, text = _fetch(base + path, method)
            assert status == 404, (path, method, text)
            assert kind.startswith("text/plain"), path
            assert "aiobk_" not in text, path  # no figures
            assert "/metrics" in text, path  # where they are
    assert _fetch(base + "/", "POST")[0] == 405
    assert _fetch(base + "/metrics", "POST")[0] == 405


@pytest.mark.timeout(30)
def test_the_exporter_serves_metrics_a_landing_page_and_404_elsewhere() -> None:
    """The exporter itself, on a registry of its own and a free port."""
    registry = CollectorRegistry()
    stats = AutoRecoveryStats(ledgers_repaired=3)
    registry.register(autorecovery_collector(stats, "ar-1"))
    server = start_exporter("127.0.0.1", 0, "aiobk autorecovery ar-1", registry)
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        check_routes(base, "aiobk autorecovery ar-1")
        text = _scrape(base + "/metrics")
        assert 'aiobk_autorecovery_ledgers_repaired_total{bookie="ar-1",node="ar-1"} 3.0' in text
        with pytest.raises(OSError, match="in use"):  # a port in use fails at once
            start_exporter("127.0.0.1", server.server_port, "again", registry)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(90)
async def test_a_bookie_process_exports_histograms_gauges_and_disk_usage(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    metrics = free_port()
    uri = etcd_server.uri(unique_name("exporter"))
    data_dir = tmp_path / "data"
    proc = BookieProcess(data_dir, None, "--metrics-port", str(metrics), "--metadata", uri)
    await proc.start()
    url = f"http://127.0.0.1:{metrics}/metrics"
    try:
        # No explicit LAC: it would move the bookie's LAC during the long poll, which wakes it.
        async with BookKeeper(uri, ClientConfig(explicit_lac_delay=0)) as bk:
            lh = await bk.create_ledger(1, 1, 1)
            await asyncio.gather(*(lh.append(PAYLOAD) for _ in range(ADDS)))
            tail = await bk.open_ledger(lh.ledger_id, recovery=False)
            # Nothing more is appended: the long poll waits its whole 0.3 s at the bookie.
            assert await tail.wait_for_lac(ADDS - 1, timeout=0.3) == ADDS - 1
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            assert len(await rh.read(0, ADDS - 1)) == ADDS
            text = await asyncio.to_thread(_scrape, url)  # the client still connected
        bookie_id = f"127.0.0.1:{proc.port}"
        await asyncio.to_thread(
            check_routes, f"http://127.0.0.1:{metrics}", f"aiobk bookie {bookie_id}"
        )
    finally:
        proc.stop()

    check_help(text)
    samples = _samples(text)
    count, total = check_histogram(samples, "aiobk_bookie_add_entry_request_seconds")
    assert count == ADDS
    assert 0 < total < ADDS * 10.0  # seconds: each add took one fdatasync or a few
    count, total = check_histogram(samples, "aiobk_bookie_read_entry_seconds")
    assert count >= ADDS  # the entries, and LAC reads
    assert total > 0
    name = "aiobk_bookie_read_entry_long_poll_wait_seconds"
    count, total = check_histogram(samples, name)
    assert count >= 1
    assert total >= 0.25
    assert dict(_buckets(samples, name))[0.16384] < count  # one waited its 0.3 s
    count, _total = check_histogram(samples, "aiobk_bookie_journal_sync_seconds")
    assert 1 <= count <= _one(samples, "aiobk_bookie_journal_syncs_total")
    # Batches written apart from their fdatasync: a ledger's first add (its key record and the
    # entry: two records) and batches of adds that came together.
    count, total = check_histogram(samples, "aiobk_bookie_journal_flush_seconds")
    assert count >= 1
    assert total > 0
    batches, records = check_histogram(samples, "aiobk_bookie_journal_batch_entries")
    assert records >= ADDS  # the adds, and the ledger's key record
    assert 1 <= batches <= records
    batches_too, journal_bytes = check_histogram(samples, "aiobk_bookie_journal_batch_bytes")
    assert batches_too == batches
    assert journal_bytes >= ADDS * len(PAYLOAD)
    assert _one(samples, "aiobk_bookie_adds_total") == ADDS
    assert _one(samples, "aiobk_bookie_writable") == 1
    assert _one(samples, "aiobk_bookie_connections_open") >= 1
    assert _one(samples, "aiobk_bookie_ledgers_held") >= 1
    assert _one(samples, "aiobk_bookie_journal_queue_size") >= 0
    assert _one(samples, "aiobk_bookie_write_cache_max_bytes") > 0
    assert _one(samples, "aiobk_autorecovery_under_replicated_ledgers") == 0
    disks = {
        dict(labels)["dir"]: value
        for (name, labels), value in samples.items()
        if name == "aiobk_bookie_disk_total_bytes"
    }
    assert set(disks) == {str(data_dir / "journal"), str(data_dir / "ledgers")}
    for (name, labels), value in samples.items():
        if name == "aiobk_bookie_disk_free_bytes":
            assert 0 <= value <= disks[dict(labels)["dir"]]
    assert dashboard_metrics() <= sample_names(text)


@pytest.mark.timeout(30)
async def test_metadata_connected_drops_to_0_when_etcd_does_not_answer() -> None:
    """``aiobk_metadata_connected`` follows the store's last call: 0 once one could not reach
    etcd (nothing listens on port 1)."""
    store = open_store("etcd://127.0.0.1:1/unreachable", timeout=1.0)
    registry = CollectorRegistry()
    registry.register(MetadataCollector(lambda: store, {"bookie": "b:1"}))
    try:
        with pytest.raises(MetadataStoreError):
            await store.list_bookies()
        assert registry.get_sample_value("aiobk_metadata_connected", {"bookie": "b:1"}) == 0
    finally:
        await store.close()
    memory = open_store(f"memory://{unique_name('connected')}")
    registry = CollectorRegistry()
    registry.register(MetadataCollector(lambda: memory, {"bookie": "b:2"}))
    await memory.list_bookies()
    assert registry.get_sample_value("aiobk_metadata_connected", {"bookie": "b:2"}) == 1
