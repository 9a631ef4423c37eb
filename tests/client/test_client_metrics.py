"""A client's figures on an application's Prometheus registry: appends and their
latency, an ensemble change, a recovery, reads and speculative reads, on real bookies."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aiobk.client import BookKeeper, ClientConfig
from aiobk.metrics import CLIENT_HELP, LOOP_LAG_HELP, register_client_metrics
from aiobk.protocol import ReadRequest
from tests.support.cluster import Cluster
from tests.support.dropping import DroppingConnector

APPENDS = 30
LABELS = {"client": "orders"}


@pytest.mark.timeout(60)
async def test_a_clients_figures_on_its_applications_registry(cluster: Cluster) -> None:
    await cluster.add_bookie()  # a fourth: room to replace one of an E3 ensemble
    net = DroppingConnector()
    config = ClientConfig(speculative_read_timeout=0.05)
    registry = CollectorRegistry()
    async with await BookKeeper.connect(cluster.uri, config, connector=net) as bk:
        collector = register_client_metrics(bk, registry, name="orders")
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        await asyncio.gather(*(lh.append(b"e" * 10) for _ in range(APPENDS)))
        await cluster.by_id(lh.metadata.ensemble[0]).crash()
        # Appends after the crash are confirmed by the two left until the failed send shows;
        # then the ensemble changes to the fourth bookie (appends wait for it meanwhile).
        appended = APPENDS
        async with asyncio.timeout(10):
            while len(lh.metadata.fragments) < 2:
                await lh.append(b"after the crash")
                appended += 1
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")  # fences and recovers it
        assert rh.last_add_confirmed == appended - 1
        # Entry 1's first bookie (alive: the crashed one was slot 0) never answers its read:
        # after speculative_read_timeout the next one is asked too.
        silent = rh.metadata.fragments[0].ensemble[1]
        net.rules.append(
            lambda to, r: to == silent and isinstance(r, ReadRequest) and r.entry_id == 1
        )
        assert [e.data for e in await rh.read(1, 1)] == [b"e" * 10]
        net.rules.clear()
        entries = await rh.read(0, appended - 1)

        def value(name: str) -> float:
            found = registry.get_sample_value(name, LABELS)
            assert found is not None, name
            return found

        assert value("aiobk_client_appends_total") == appended
        assert value("aiobk_client_append_bytes_total") == APPENDS * 10 + (appended - APPENDS) * 15
        assert value("aiobk_client_append_seconds_count") == appended
        assert 0 < value("aiobk_client_append_seconds_sum") < appended * 10.0
        last = registry.get_sample_value(
            "aiobk_client_append_seconds_bucket", {**LABELS, "le": "+Inf"}
        )
        assert last == appended
        assert value("aiobk_client_ensemble_changes_total") == 1
        assert value("aiobk_client_recoveries_total") == 1
        assert value("aiobk_client_recovery_failures_total") == 0
        assert value("aiobk_client_entries_read_total") == 1 + len(entries)
        assert value("aiobk_client_speculative_reads_total") >= 1
        assert value("aiobk_client_pending_appends") >= 0  # a send to the crashed one may hold one
        assert value("aiobk_client_append_failures_total") == 0

        text = generate_latest(registry).decode()
        for family in text_string_to_metric_families(text):
            if family.name == "aiobk_event_loop_lag_seconds":  # the client's loop, measured
                assert family.documentation == LOOP_LAG_HELP
                continue
            name = family.name.removeprefix("aiobk_client_")
            assert family.documentation == CLIENT_HELP[name], family.name
        assert registry.get_sample_value("aiobk_event_loop_lag_seconds_count") is not None
        registry.unregister(collector)
        assert registry.get_sample_value("aiobk_client_appends_total", LABELS) is None


CLIENT_DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/client-dashboard.json"


async def test_the_client_dashboard_charts_only_what_a_client_exports() -> None:
    """Every metric a query of deploy/grafana/client-dashboard.json names is one that
    ``register_client_metrics`` puts on an application's registry (a histogram by its
    ``_bucket``, ``_sum`` or ``_count`` series), and every client figure is charted."""
    board = json.loads(CLIENT_DASHBOARD.read_text())
    queried: set[str] = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            queried.update(re.findall(r"\baiobk_[a-z_]+\b", target["expr"]))
    for variable in board["templating"]["list"]:
        queried.update(re.findall(r"\baiobk_[a-z_]+\b", variable.get("definition", "")))
    registry = CollectorRegistry()
    register_client_metrics(BookKeeper("memory://client-dashboard"), registry, name="board")
    text = generate_latest(registry).decode()
    served = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert queried, "the dashboard queries nothing"
    assert queried <= served, sorted(queried - served)
    families = {f.name for f in text_string_to_metric_families(text)}
    charted = {name.removesuffix("_bucket") for name in queried}
    assert {f.removesuffix("_total") for f in families} <= {
        c.removesuffix("_total") for c in charted
    }, "a client figure no panel charts"
