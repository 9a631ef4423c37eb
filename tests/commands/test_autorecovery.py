"""``aiobk autorecovery ...`` and ``aiobk bookies decommission`` run as users run them (child
processes), against a real etcd and real bookies in process; argument errors through the
console script's entry point in this process (``aiobk.cli.main``), which is quicker."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from aiobk.autorecovery.fragments import bookies_named
from aiobk.bookie import Bookie
from aiobk.cli import main
from aiobk.client import BookKeeper
from aiobk.commands import autorecovery as autorecovery_commands
from aiobk.commands import common
from aiobk.metadata import CHECK, EtcdProcess, MetadataStore, free_port, open_store
from aiobk.runner import make_bookie
from tests.autorecovery.helpers import FAST, assert_copies, ledgers_naming
from tests.autorecovery.test_status import seed
from tests.support.cli import CHILD_COMMAND, CHILD_ENV, aiobk_child, one_line_error
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until

StartCluster = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def make_cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[StartCluster]:
    started: list[Cluster] = []

    async def make(count: int = 4, **settings: Any) -> Cluster:
        uri = etcd_server.uri(unique_name("arcli"))
        cluster = await start_cluster(tmp_path, count, uri=uri, **{**FAST, **settings})
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        await cluster.stop()


async def _closed(bk: BookKeeper, entries: int = 10, **shape: int) -> int:
    lh = await bk.create_ledger(
        shape.get("ensemble_size", 3), shape.get("write_quorum", 3), shape.get("ack_quorum", 2)
    )
    for i in range(entries):
        await lh.append(b"entry %d" % i)
    await lh.close()
    return lh.ledger_id


async def _lose(cluster: Cluster, bookie: Bookie) -> None:
    """Gone for good: crashed, its disk gone, out of the registry."""
    cluster.bookies.remove(bookie)
    await bookie.crash()
    shutil.rmtree(bookie.config.data_dir)
    async with open_store(cluster.uri) as store:
        await wait_until(lambda: _unregistered(store, bookie.bookie_id), timeout=10, every=0.2)


async def _unregistered(store: MetadataStore, bookie_id: str) -> bool:
    return bookie_id not in {b.bookie_id for b in await store.list_bookies()}


# ---------------------------------------------------------------------------- status and lists


@pytest.mark.timeout(60)
async def test_status_list_and_switches_print_their_shapes(etcd_server: EtcdProcess) -> None:
    uri = etcd_server.uri(unique_name("arcli"))
    async with open_store(uri) as store:
        lease = await seed(store)  # marks of every kind, an auditor, b3:3 draining, disabled
        try:
            code, out, err = await aiobk_child(
                "autorecovery", "list-underreplicated", "--json", "--metadata", uri
            )
            assert (code, out) == (0, "[10, 11, 13]\n"), err
            code, out, err = await aiobk_child(
                "autorecovery", "status", "--json", "--metadata", uri
            )
            assert code == 0, err
            assert json.loads(out) == {
                "auditor": "auditor-1",
                "enabled": False,
                "lost_bookies": {"b1:1": 500},
                "absent_bookies": {"b2:2": 1500},
                "under_replicated_ledgers": 3,
                "lost_ledger_count": 2,
                "lost_ledgers": [
                    {"ledger_id": 12, "ranges": [[0, 9]]},
                    {"ledger_id": 13, "ranges": [[5, 5], [7, 8]]},
                ],
                "last_check": 6000,
                "last_bookie_check": 7000,
                "status_from": "auditor-1",
                "decommissioning": ["b3:3"],
            }
            code, out, err = await aiobk_child("autorecovery", "status", "--metadata", uri)
            assert code == 0, err
            for line in (
                "auditor: auditor-1",
                "autorecovery: disabled",
                "lost bookies: 1",
                "  b1:1  absent since 1970-01-01 00:00:00 UTC",
                "absent bookies (not lost yet): 1",
                "under-replicated ledgers: 3",
                "lost ledgers: 2",
                "  ledger 12: entries 0-9",
                "  ledger 13: entries 5, 7-8",
                "last full check: 1970-01-01 00:00:06 UTC",
                "decommissioning: b3:3",
            ):
                assert line in out, out
            await store.autorecovery.claim(11, "worker-7", lease.id)
            code, out, err = await aiobk_child(
                "autorecovery", "list-underreplicated", "--metadata", uri
            )
            assert code == 0, err
            rows = [line for line in out.splitlines() if line.split()[:1] == ["11"]]
            assert len(rows) == 1, out
            for cell in ("b1:1, b2:2", "check", "worker-7"):
                assert cell in rows[0], out
            assert "5, 7-8" in out
            # trigger-audit reaches the elected auditor through the store.
            code, out, err = await aiobk_child(
                "autorecovery", "trigger-audit", "--json", "--metadata", uri
            )
            assert code == 0, err
            document = json.loads(out)
            assert document == {
                "auditor": "auditor-1",
                "revision": await store.autorecovery.audit_requested(),
                "enabled": False,
            }
            assert document["revision"] > 0
        finally:
            await lease.close()
        code, out, err = await aiobk_child("autorecovery", "enable", "--json", "--metadata", uri)
        assert (code, json.loads(out)) == (0, {"enabled": True, "was_enabled": False}), err
        assert await store.autorecovery.enabled()
        code, out, err = await aiobk_child("autorecovery", "enable", "--metadata", uri)
        assert (code, out) == (
            0,
            "autorecovery enabled: workers repair marked ledgers (it was already enabled)\n",
        )
        code, out, err = await aiobk_child("autorecovery", "disable", "--metadata", uri)
        assert code == 0, err
        assert out.startswith("autorecovery disabled: workers take no more ledgers")
        assert not await store.autorecovery.enabled()
        # No auditor any more (its lease closed): a trigger would reach nobody.
        code, out, err = await aiobk_child("autorecovery", "trigger-audit", "--metadata", uri)
        assert "no auditor is elected" in one_line_error(code, err)


@pytest.mark.timeout(60)
async def test_disable_keeps_a_lost_bookies_mark_and_enable_repairs_it(
    make_cluster: StartCluster,
) -> None:
    cluster = await make_cluster()
    uri = cluster.uri
    code, out, err = await aiobk_child("autorecovery", "disable", "--json", "--metadata", uri)
    assert (code, json.loads(out)) == (0, {"enabled": False, "was_enabled": True}), err
    async with BookKeeper(uri) as bk:
        store = bk.store
        ledger_id = await _closed(bk)
        victim_id = (await store.read_ledger(ledger_id)).fragments[0].ensemble[0]
        await _lose(cluster, cluster.by_id(victim_id))
        await wait_until(lambda: _marked(store, ledger_id), timeout=30, every=0.2)
        await asyncio.sleep(1.0)  # five polls of every worker: none takes it
        code, out, err = await aiobk_child(
            "autorecovery", "list-underreplicated", "--json", "--metadata", uri
        )
        assert (code, json.loads(out)) == (0, [ledger_id]), err
        assert victim_id in bookies_named(await store.read_ledger(ledger_id))
        code, out, err = await aiobk_child("autorecovery", "status", "--json", "--metadata", uri)
        status = json.loads(out)
        assert status["enabled"] is False
        assert status["under_replicated_ledgers"] == 1
        assert status["auditor"] in {b.bookie_id for b in cluster.bookies}
        assert victim_id in status["lost_bookies"]
        code, out, err = await aiobk_child("autorecovery", "enable", "--metadata", uri)
        assert (code, out) == (0, "autorecovery enabled: workers repair marked ledgers again\n")
        await wait_until(lambda: _clear(store, ledger_id, victim_id), timeout=30, every=0.2)
        await assert_copies(bk, ledger_id)
        code, out, err = await aiobk_child(
            "autorecovery", "list-underreplicated", "--json", "--metadata", uri
        )
        assert (code, out) == (0, "[]\n")


async def _marked(store: MetadataStore, ledger_id: int, reason: str | None = None) -> bool:
    mark = await store.autorecovery.read_mark(ledger_id)
    return mark is not None and (reason is None or reason in mark.reasons)


async def _clear(store: MetadataStore, ledger_id: int, bookie_id: str) -> bool:
    if await store.autorecovery.read_mark(ledger_id) is not None:
        return False
    return bookie_id not in bookies_named(await store.read_ledger(ledger_id))


@pytest.mark.timeout(60)
async def test_trigger_audit_finds_the_copies_a_wiped_bookie_lost(
    make_cluster: StartCluster,
) -> None:
    """A bookie back under its old id with an empty disk: only a check can tell. The periodic
    check never runs here (interval 0); trigger-audit makes the auditor run one now."""
    cluster = await make_cluster(
        3, auditor_periodic_check_interval=0.0, lost_bookie_recovery_delay=30.0
    )
    uri = cluster.uri
    async with BookKeeper(uri) as bk:
        store = bk.store
        ledger_id = await _closed(bk)
        await wait_until(lambda: _has_auditor(store), timeout=30, every=0.2)
        await store.autorecovery.set_enabled(False)  # the mark stays to be seen
        victim = cluster.bookies[1]
        await victim.stop()
        shutil.rmtree(victim.config.data_dir)
        empty = victim.config.with_changes(
            port=victim.address.port, allow_cookie_fix=True, boot_repair=False
        )
        fresh = make_bookie(empty)
        await fresh.start()
        cluster.bookies[1] = fresh
        await asyncio.sleep(1.0)  # the auditor's loop goes round: nothing is marked by itself
        assert not await _marked(store, ledger_id)
        code, out, err = await aiobk_child("autorecovery", "trigger-audit", "--metadata", uri)
        assert code == 0, err
        assert out.startswith("audit requested: auditor ")
        assert "autorecovery is disabled" in out
        await wait_until(lambda: _marked(store, ledger_id, CHECK), timeout=20, every=0.2)
        mark = await store.autorecovery.read_mark(ledger_id)
        assert mark is not None
        assert mark.missing == (fresh.bookie_id,)
        code, out, err = await aiobk_child(
            "autorecovery", "list-underreplicated", "--json", "--metadata", uri
        )
        assert (code, json.loads(out)) == (0, [ledger_id]), err
        await store.autorecovery.set_enabled(True)
        await wait_until(lambda: _unmarked(store, ledger_id), timeout=30, every=0.2)
        await assert_copies(bk, ledger_id)  # the gap filled, wherever it went


async def _has_auditor(store: MetadataStore) -> bool:
    return await store.autorecovery.auditor() is not None


async def _unmarked(store: MetadataStore, ledger_id: int) -> bool:
    return await store.autorecovery.read_mark(ledger_id) is None


# ------------------------------------------------------------------------------- decommission


@pytest.mark.timeout(60)
async def test_decommission_a_dead_bookie(make_cluster: StartCluster) -> None:
    """The auditor would wait a minute to call it lost; decommissioning does not wait. A WQ=1
    ledger it alone held is reported lost, the rest are copied from the survivors."""
    cluster = await make_cluster(lost_bookie_recovery_delay=60.0)
    uri = cluster.uri
    async with BookKeeper(uri) as bk:
        store = bk.store
        single = await _closed(bk, 5, ensemble_size=1, write_quorum=1, ack_quorum=1)
        victim_id = (await store.read_ledger(single)).fragments[0].ensemble[0]
        replicated = []
        for _attempt in range(40):  # bounded: each lands on the victim with odds 3/4
            ledger_id = await _closed(bk)
            if victim_id in bookies_named(await store.read_ledger(ledger_id)):
                replicated.append(ledger_id)
            if len(replicated) == 2:
                break
        assert len(replicated) == 2
        await wait_until(lambda: _has_auditor(store), timeout=30, every=0.2)
        await _lose(cluster, cluster.by_id(victim_id))
        assert await store.read_cookie(victim_id) is not None
        code, out, err = await aiobk_child(
            "bookies",
            "decommission",
            victim_id,
            "--metadata",
            uri,
            "--timeout",
            "30",
            "--poll-interval",
            "0.2",
            "--json",
        )
        assert code == 0, err
        assert json.loads(out) == {
            "bookie_id": victim_id,
            "ledgers": 3,
            "was_running": False,
            "cookie_removed": True,
            "lost_ledgers": [{"ledger_id": single, "ranges": [[0, 4]]}],
        }
        assert f"warning: ledger {single}: entries 0-4 had no copy left on any bookie" in err
        assert "still name it" in err  # progress, on stderr
        assert await ledgers_naming(store, victim_id) == []
        assert await store.read_cookie(victim_id) is None
        assert await store.autorecovery.decommissioning() == set()
        for ledger_id in replicated:
            await assert_copies(bk, ledger_id)
        code, out, err = await aiobk_child("autorecovery", "status", "--json", "--metadata", uri)
        assert json.loads(out)["lost_ledgers"] == [{"ledger_id": single, "ranges": [[0, 4]]}]
        # Done once: the bookie is unknown now.
        code, out, err = await aiobk_child("bookies", "decommission", victim_id, "--metadata", uri)
        assert f"unknown bookie {victim_id!r}" in one_line_error(code, err)


@pytest.mark.timeout(60)
async def test_decommission_a_live_bookie_waits_for_it_to_be_stopped(
    make_cluster: StartCluster,
) -> None:
    cluster = await make_cluster(lost_bookie_recovery_delay=60.0)
    uri = cluster.uri
    async with BookKeeper(uri) as bk:
        store = bk.store
        ids = [await _closed(bk) for _ in range(3)]
        victim_id = (await store.read_ledger(ids[0])).fragments[0].ensemble[2]
        named = await ledgers_naming(store, victim_id)
        await wait_until(lambda: _has_auditor(store), timeout=30, every=0.2)
        proc = await asyncio.create_subprocess_exec(
            *CHILD_COMMAND, "bookies", "decommission", victim_id, "--metadata", uri,
            "--timeout", "30", "--poll-interval", "0.2",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=CHILD_ENV,
        )  # fmt: skip
        assert proc.stderr is not None
        shown: list[str] = []
        try:
            async with asyncio.timeout(40):
                while not any("Stop the bookie process now" in line for line in shown):
                    line = (await proc.stderr.readline()).decode()
                    assert line, "".join(shown)  # the command ended before saying so
                    shown.append(line)
            assert any(f"{victim_id} set read-only" in line for line in shown), shown
            assert await ledgers_naming(store, victim_id) == []
            assert await store.read_cookie(victim_id) is not None  # not while it runs
            victim = cluster.by_id(victim_id)
            cluster.bookies.remove(victim)
            await victim.stop()
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, "".join(shown) + err.decode()
        assert out.decode() == (
            f"bookie {victim_id} decommissioned: {len(named)} ledger(s) re-replicated, "
            "cookie removed\n"
        )
        assert await store.read_cookie(victim_id) is None
        assert await store.autorecovery.decommissioning() == set()
        for ledger_id in ids:
            await assert_copies(bk, ledger_id)


@pytest.mark.timeout(60)
async def test_bad_input_and_an_unreachable_store_are_one_line_errors(
    etcd_server: EtcdProcess,
) -> None:
    """As the console script runs (child processes, at once): the store is asked."""
    uri = etcd_server.uri(unique_name("arcli"))
    async with open_store(uri) as store:
        await store.set_up_cluster("arcli")  # a cluster, with no bookie and no ledger yet
    empty = etcd_server.uri(unique_name("arcli"))  # no cluster at all
    down = f"etcd://127.0.0.1:{free_port()}/x"  # nothing listens: refused
    cases: list[tuple[list[str], str]] = [
        (["bookies", "decommission", "x:1", "--metadata", empty],
         "no aiobk cluster was ever set up under prefix"),
        (["bookies", "decommission", "nobody:1", "--metadata", uri],
         "unknown bookie 'nobody:1': not registered, no cookie, named in no ledger"),
        (["bookies", "decommission", "x:1", "--metadata", down], "unreachable"),
        (["autorecovery", "status", "--metadata", down], "unreachable"),
        (["autorecovery", "start", "--metadata", down],
         "cannot start autorecovery: etcd://127.0.0.1"),
        (["autorecovery", "trigger-audit", "--metadata", uri], "no auditor is elected"),
    ]  # fmt: skip
    results = await asyncio.gather(*(aiobk_child(*args) for args, _text in cases))
    for (args, text), (code, out, err) in zip(cases, results, strict=True):
        assert text in one_line_error(code, err), (args, err)
        assert out == "", (args, out)


@pytest.mark.timeout(60)
def test_bad_arguments_are_one_line_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script's entry point in this process (no store is reached: each is refused
    before any I/O, or on a store that refuses at once); logging is left as pytest set it."""
    for module in (common, autorecovery_commands):
        monkeypatch.setattr(module, "configure_logging", lambda _level: None)
    monkeypatch.delenv("AIOBK_METADATA", raising=False)
    uri = "etcd://127.0.0.1:2379/unused"
    down = f"etcd://127.0.0.1:{free_port()}/x"
    bad_toml = tmp_path / "bookie.toml"
    bad_toml.write_text("colour = 'blue'\n[autorecovery]\nlost_bookie_recovery_delay = 1.0\n")
    cases: list[tuple[list[str], int, str]] = [
        (["bookies", "decommission", "x:1", "--metadata", uri, "--timeout", "0"], 2,
         "--timeout"),
        (["bookies", "decommission", "x:1", "--metadata", uri, "--timeout", "soon"], 2,
         "--timeout"),
        (["bookies", "decommission", "x:1", "--metadata", uri, "--log-level", "chatty"], 2,
         "--log-level"),
        (["bookies", "decommission", "x:1", "--metadata", uri, "--poll-interval", "0"], 2,
         "--poll-interval"),
        (["bookies", "decommission", "x:1"], 2, "--metadata (or AIOBK_METADATA) is required"),
        (["autorecovery", "list-underreplicated", "--json", "--metadata", down], 1,
         "unreachable"),
        (["autorecovery", "disable", "--metadata", down], 1, "unreachable"),
        (["autorecovery", "status", "--metadata", "zookeeper://x"], 2,
         "unsupported metadata URI"),
        (["autorecovery", "status"], 2, "--metadata (or AIOBK_METADATA) is required"),
        (["autorecovery", "start", "--config", str(bad_toml), "--metadata", uri], 2,
         "unknown setting 'colour'"),
        (["autorecovery", "start", "--config", str(tmp_path / "none.toml")], 2,
         "cannot read config file"),
        (["autorecovery", "start", "--metadata", uri, "--rereplication-retry-delay", "0"], 2,
         "rereplication_retry_delay must be positive"),
        (["autorecovery", "start", "--metadata", uri, "--lost-bookie-recovery-delay", "-1"],
         2, "lost_bookie_recovery_delay must not be negative"),
        (["autorecovery", "start", "--metadata", uri, "--log-level", "chatty"], 2,
         "--log-level"),
        (["autorecovery", "start"], 2, "--metadata"),
    ]  # fmt: skip
    for args, expected, text in cases:
        with pytest.raises(SystemExit) as exited:
            main(args)
        captured = capsys.readouterr()
        assert exited.value.code == expected, (args, captured.err)
        assert text in one_line_error(expected, captured.err, expected), (args, captured.err)
        assert captured.out == "", (args, captured.out)


# ---------------------------------------------------------------------------- a standalone one


@pytest.mark.timeout(60)
async def test_a_standalone_autorecovery_process_audits_repairs_exports_and_stops(
    make_cluster: StartCluster, tmp_path: Path
) -> None:
    """Bookies without autorecovery of their own; ``aiobk autorecovery start`` does it all."""
    cluster = await make_cluster(autorecovery_enabled=False)
    uri = cluster.uri
    config = tmp_path / "bookie.toml"
    config.write_text(
        f"metadata_uri = {uri!r}\n"
        "data_dir = '/elsewhere'  # a bookie's own setting: ignored here\n"
        "port = 3181\n"
        "log_level = 'warning'\n"
        "[autorecovery]\n"
        "lost_bookie_recovery_delay = 0.5\n"
        "autorecovery_poll_interval = 0.2\n"
        "autorecovery_lease_ttl = 2.0\n"
    )
    metrics = free_port()
    proc = await asyncio.create_subprocess_exec(
        *CHILD_COMMAND, "autorecovery", "start", "--config", str(config), "--id", "ar-test",
        "--metrics-port", str(metrics), "--rereplication-retry-delay", "0.2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=CHILD_ENV,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line.decode() == f"autorecovery ar-test running on {uri}\n"
        async with BookKeeper(uri) as bk:
            store = bk.store
            await wait_until(lambda: _auditor_is(store, "ar-test"), timeout=20, every=0.2)
            ledger_id = await _closed(bk)
            victim_id = (await store.read_ledger(ledger_id)).fragments[0].ensemble[1]
            await _lose(cluster, cluster.by_id(victim_id))
            await wait_until(lambda: _clear(store, ledger_id, victim_id), timeout=30, every=0.2)
            await assert_copies(bk, ledger_id)
            url = f"http://127.0.0.1:{metrics}/metrics"
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(url, timeout=10).read().decode()
            )
            for sample in (
                'aiobk_autorecovery_auditor_elections_total{bookie="ar-test",node="ar-test"} 1.0',
                'aiobk_autorecovery_ledgers_repaired_total{bookie="ar-test",node="ar-test"} 1.0',
                'aiobk_autorecovery_entries_replicated_total{bookie="ar-test",node="ar-test"} 10.0',
                "# TYPE aiobk_autorecovery_under_replicated_ledgers gauge",
                'aiobk_autorecovery_bookies_registered{bookie="ar-test",node="ar-test"} ',
                'aiobk_metadata_connected{bookie="ar-test",node="ar-test"} 1.0',
                "aiobk_event_loop_lag_seconds_count ",
            ):
                assert sample in text, text
            proc.send_signal(signal.SIGTERM)
            _out, err = await asyncio.wait_for(proc.communicate(), 20)
            assert proc.returncode == 0, err.decode()
            assert "stopping" in err.decode()
            # Its lease went with it
            await wait_until(lambda: _auditor_is(store, None), timeout=10, every=0.2)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _auditor_is(store: MetadataStore, wanted: str | None) -> bool:
    return await store.autorecovery.auditor() == wanted
