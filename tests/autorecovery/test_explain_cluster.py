"""``aiobk autorecovery explain`` end to end: through the command line, the HTTP admin API and
``aiobk.autorecovery.explain_ledger``, on real bookies and a real etcd, in the states operators
meet -- no bookie to copy to, autorecovery disabled, a worker copying under its throttle, an
open ledger in its grace period -- and once repaired."""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from aiobk.autorecovery import AutoRecovery, AutoRecoveryConfig, explain_ledger
from aiobk.autorecovery.explain import model as m
from aiobk.bookie import Bookie
from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess, MetadataStore
from aiobk.runner import start_http_admin
from tests.autorecovery.helpers import FAST, assert_copies
from tests.support.cli import aiobk_child, one_line_error
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until


@pytest.fixture
async def clusters() -> AsyncIterator[list[Cluster]]:
    made: list[Cluster] = []
    yield made
    for cluster in made:
        await cluster.stop()


async def _cluster(
    made: list[Cluster], tmp_path: Path, etcd: EtcdProcess, count: int, **settings: object
) -> Cluster:
    uri = etcd.uri(unique_name("explain"))
    cluster = await start_cluster(tmp_path, count, uri=uri, **{**FAST, **settings})
    made.append(cluster)
    return cluster


async def _lose(cluster: Cluster, bookie: Bookie) -> None:
    cluster.bookies.remove(bookie)
    await bookie.crash()
    shutil.rmtree(bookie.config.data_dir)
    async with cluster.store as store:

        async def gone() -> bool:
            return bookie.bookie_id not in {b.bookie_id for b in await store.list_bookies()}

        await wait_until(gone, timeout=10, every=0.2)


async def _closed(bk: BookKeeper, entries: int = 10, size: int = 8) -> int:
    lh = await bk.create_ledger(3, 3, 2)
    for i in range(entries):
        await lh.append(b"%08d" % i + bytes(max(0, size - 8)))
    await lh.close()
    return lh.ledger_id


async def _attempt_kind(store: MetadataStore, ledger_id: int, kind: str) -> bool:
    attempt = await store.autorecovery.read_attempt(ledger_id)
    return attempt is not None and attempt.kind == kind


@pytest.mark.timeout(150)
async def test_cli_explains_a_repair_with_nowhere_to_go_then_a_healthy_ledger(
    clusters: list[Cluster], tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    cluster = await _cluster(clusters, tmp_path, etcd_server, 3)
    uri = cluster.uri
    async with BookKeeper(uri) as bk:
        ledger_id = await _closed(bk)
        victim = cluster.bookies[0]
        await _lose(cluster, victim)
        # The auditor marks it; the workers try, find no bookie outside the ensemble, and say so.
        await wait_until(
            lambda: _attempt_kind(bk.store, ledger_id, m.NO_TARGET), timeout=30, every=0.2
        )
        code, out, err = await aiobk_child(
            "autorecovery", "explain", str(ledger_id), "--json", "--metadata", uri
        )
        assert code == 0, err
        document = json.loads(out)
        assert document["status"] == "under-replicated"
        assert document["under_replicated"] is True
        assert document["mark"]["missing"] == [victim.bookie_id]
        assert document["copies_checked"] is True
        [fragment] = document["fragments"]
        assert fragment["copies"][victim.bookie_id] == "lost-bookie"
        assert {fragment["copies"][b.bookie_id] for b in cluster.bookies} == {"held"}
        assert fragment["missing"] == [victim.bookie_id]
        kinds = [b["kind"] for b in document["blockers"]]
        assert kinds[0] == m.NO_TARGET, document["blockers"]
        # The workers' own word (they keep trying, so one may hold it right now).
        assert document["last_attempt"]["kind"] == m.NO_TARGET
        assert "need 1 writable bookies, have 0" in document["last_attempt"]["detail"]
        assert set(kinds[1:]) <= {m.CLAIMED, m.BACKOFF}, kinds
        assert any(a.startswith("add a bookie") for a in document["actions"])

        code, out, err = await aiobk_child(
            "autorecovery", "explain", str(ledger_id), "--metadata", uri
        )
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith(f"ledger {ledger_id} (closed) is under-replicated: copies of")
        assert "no writable bookie outside the ensemble of entries 0-9" in lines[0]
        assert "what holds it:" in lines
        assert "what you can do:" in lines

        await cluster.add_bookie()  # somewhere to go: the next attempt repairs it

        async def repaired() -> bool:
            return await bk.store.autorecovery.read_mark(ledger_id) is None

        await wait_until(repaired, timeout=40, every=0.2)
        await assert_copies(bk, ledger_id)
        code, out, err = await aiobk_child(
            "autorecovery", "explain", str(ledger_id), "--json", "--metadata", uri
        )
        document = json.loads(out)
        assert (document["status"], document["blockers"]) == ("healthy", []), document
        assert document["last_attempt"] is None  # removed once repaired
        code, out, err = await aiobk_child(
            "autorecovery", "explain", str(ledger_id), "--metadata", uri
        )
        assert out.splitlines()[:2] == [
            f"ledger {ledger_id} (closed) is fully replicated",
            "fragments:",
        ], out
        assert "what holds it:" not in out
        code, out, err = await aiobk_child(
            "autorecovery", "explain", "123456789", "--metadata", uri
        )
        assert (code, out) == (0, "ledger 123456789 does not exist (never created, or deleted)\n")
    code, _out, err = await aiobk_child("autorecovery", "explain", "x", "--metadata", uri)
    assert "'x' is not a valid integer" in one_line_error(code, err, 2)
    code, _out, err = await aiobk_child("autorecovery", "explain", "1")
    assert "--metadata (or AIOBK_METADATA) is required" in one_line_error(code, err, 2)


@pytest.mark.timeout(60)
async def test_http_explains_a_disabled_autorecovery_and_refuses_bad_input(
    clusters: list[Cluster], tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    cluster = await _cluster(clusters, tmp_path, etcd_server, 4, gc_interval=0)
    bookie = cluster.bookies[0]
    await bookie.stop()  # again, with its HTTP API
    cluster.bookies.remove(bookie)
    served = await cluster.add_bookie(http_port=0, gc_interval=0)
    http = await start_http_admin(served)
    assert http is not None
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
    try:
        async with BookKeeper(cluster.uri) as bk:
            await bk.store.autorecovery.set_enabled(False)
            ledger_id = await _closed(bk)
            named = (await bk.store.read_ledger(ledger_id)).fragments[0].ensemble
            victim = cluster.by_id(next(b for b in named if b != served.bookie_id))
            await _lose(cluster, victim)

            async def marked() -> bool:
                return await bk.store.autorecovery.read_mark(ledger_id) is not None

            await wait_until(marked, timeout=20, every=0.2)
            path = f"{http.url}/api/v1/autorecovery/explain?ledger_id={ledger_id}"
            async with session.get(path) as response:
                assert response.status == 200
                document = await response.json()
            assert document["status"] == "under-replicated"
            assert document["blockers"][0]["kind"] == m.DISABLED
            assert "`aiobk autorecovery enable`" in document["actions"]
            assert document["copies_checked"] is True
            async with session.get(path + "&check=false") as response:
                assert (await response.json())["copies_checked"] is False
            async with session.get(f"{http.url}/api/v1/autorecovery/explain?ledger_id=999999") as r:
                assert (r.status, (await r.json())["status"]) == (200, "no-such-ledger")
            for query, words in (
                ("", "ledger_id is required"),
                ("?ledger_id=abc", "ledger_id must be an integer"),
                (f"?ledger_id={ledger_id}&check=maybe", "check must be true or false"),
            ):
                async with session.get(f"{http.url}/api/v1/autorecovery/explain{query}") as r:
                    assert r.status == 400
                    assert words in (await r.json())["error"]
            await bk.store.autorecovery.set_enabled(True)
            await wait_until(lambda: _not_marked(bk.store, ledger_id), timeout=30, every=0.2)
            async with session.get(path) as response:
                assert (await response.json())["status"] == "healthy"
    finally:
        await session.close()
        await http.stop()


async def _not_marked(store: MetadataStore, ledger_id: int) -> bool:
    return await store.autorecovery.read_mark(ledger_id) is None


@pytest.mark.timeout(60)
async def test_a_throttled_copy_is_explained_with_its_worker_and_progress(
    clusters: list[Cluster], tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    cluster = await _cluster(clusters, tmp_path, etcd_server, 4, autorecovery_enabled=False)
    async with BookKeeper(cluster.uri) as bk:
        ledger_id = await _closed(bk, 60, 2000)  # ~120 KB at 4 KB/s: half a minute to copy
        victim = (await bk.store.read_ledger(ledger_id)).fragments[0].ensemble[0]
        config = AutoRecoveryConfig(
            lost_bookie_recovery_delay=0.2,
            rereplication_max_bytes_per_second=4_000,
            autorecovery_poll_interval=0.2,
            autorecovery_lease_ttl=5.0,
        )
        service = AutoRecovery(
            bk.store, config, "throttled-worker", wall_clock=time.time,
            secret_bytes=random.Random(3).randbytes,
        )  # fmt: skip
        await service.start()
        try:
            await _lose(cluster, cluster.by_id(victim))

            async def copying() -> bool:
                attempt = await bk.store.autorecovery.read_attempt(ledger_id)
                return attempt is not None and attempt.entries_copied > 0

            await wait_until(copying, timeout=30, every=0.2)
            explanation = await explain_ledger(bk.store, ledger_id, pool=bk.pool)
            assert explanation.claimant == "throttled-worker"
            kinds = [b.kind for b in explanation.blockers]
            assert kinds[:2] == [m.CLAIMED, m.THROTTLED], explanation.blockers
            assert "being repaired by worker throttled-worker since" in explanation.reason
            assert " of 60 entries copied" in explanation.reason
            assert "capped at 4000 bytes/s" in explanation.blockers[1].message
            assert explanation.attempt is not None
            assert explanation.attempt.entries_to_copy == 60
        finally:
            await service.stop()


@pytest.mark.timeout(60)
async def test_an_open_ledger_is_explained_as_waiting_out_its_grace_period(
    clusters: list[Cluster], tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    cluster = await _cluster(
        clusters, tmp_path, etcd_server, 4, open_ledger_rereplication_grace_period=300.0
    )
    async with BookKeeper(cluster.uri) as bk:
        lh = await bk.create_ledger(3, 3, 2)
        await lh.append(b"written, and the writer stays idle")
        victim = lh.metadata.fragments[0].ensemble[1]

        def on_every_copy() -> bool:  # else the writer replaces the victim once it is lost
            states = [cluster.by_id(b).storage.get(lh.ledger_id) for b in lh.metadata.ensemble]
            return all(s is not None and s.last_add_synced >= 0 for s in states)

        await wait_until(on_every_copy, timeout=10, every=0.01)
        await _lose(cluster, cluster.by_id(victim))

        async def marked() -> bool:
            return await bk.store.autorecovery.read_mark(lh.ledger_id) is not None

        await wait_until(marked, timeout=20, every=0.2)
        code, out, err = await aiobk_child(
            "autorecovery", "explain", str(lh.ledger_id), "--json", "--metadata", cluster.uri
        )
        assert code == 0, err
        document = json.loads(out)
        assert document["ledger_state"] == "OPEN"
        grace = next(b for b in document["blockers"] if b["kind"] == m.GRACE)
        assert "open_ledger_rereplication_grace_period (300s)" in grace["message"]
        assert grace["until"] == document["mark"]["since"] + 300_000
        assert document["fragments"][-1]["last_entry"] is None
        await lh.close()


@pytest.mark.timeout(60)
async def test_decommission_progress_names_the_ledgers_left_and_what_holds_them(
    clusters: list[Cluster], tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    """Open ledgers on the bookie wait out their writers' grace period (300 s here): the drain
    names the first few left, each with what holds it, counts the rest, and its timeout says
    what holds them too."""
    cluster = await _cluster(
        clusters, tmp_path, etcd_server, 4,
        lost_bookie_recovery_delay=60.0, open_ledger_rereplication_grace_period=300.0,
    )  # fmt: skip
    async with BookKeeper(cluster.uri) as bk:
        closed_id = await _closed(bk)
        victim = (await bk.store.read_ledger(closed_id)).fragments[0].ensemble[0]
        handles = []
        while len(handles) < 7:  # bounded: 3 in 4 land on it
            lh = await bk.create_ledger(3, 3, 2)
            if victim in lh.metadata.fragments[0].ensemble:
                await lh.append(b"the writer stays idle")
                handles.append(lh)
            else:
                await lh.close()
        opened = [lh.ledger_id for lh in handles]

        async def auditor() -> bool:
            return await bk.store.autorecovery.auditor() is not None

        await wait_until(auditor, timeout=20, every=0.2)
        code, _out, err = await aiobk_child(
            "bookies", "decommission", victim, "--metadata", cluster.uri,
            "--timeout", "3", "--poll-interval", "0.2",
        )  # fmt: skip
        assert code == 1, err
        lines = err.strip().splitlines()
        named = {}
        for line in lines:
            found = re.fullmatch(r"  ledger (\d+) not done: (.+)", line)
            if found:
                named[int(found[1])] = found[2]
        assert len(named) == 5, err  # the first five left, each with its reason
        assert set(named) <= {closed_id, *opened}, err
        for ledger_id in set(named) & set(opened):
            assert named[ledger_id].startswith("the ledger is open and its writer's fragment")
        more = [line for line in lines if line.startswith("  and ")]
        assert more, err
        assert re.fullmatch(r"  and \d+ more \(`aiobk autorecovery explain LEDGER_ID`.*", more[0])
        assert lines[-1].startswith("aiobk: error: timed out after 3s"), err
        assert "; what holds them: ledger " in lines[-1]
        assert f"ledger {min(opened)}: the ledger is open" in lines[-1]
        assert "open_ledger_rereplication_grace_period (300s)" in lines[-1]
        for lh in handles:
            await lh.close()
        await aiobk_child("bookies", "decommission", victim, "--cancel", "--metadata", cluster.uri)
