"""BP-46 on real bookies: cookies, unclean shutdown, limbo, and the two scenarios of data loss,
each run with the protection switched off (the loss happens) and on (it does not)."""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
from pathlib import Path

import pytest

from aiobk.bookie import Bookie, BookieConfig
from aiobk.client import BookKeeper, ClientConfig, Digester, Durability, LedgerHandle
from aiobk.client.errors import (
    DataUnknownError,
    LedgerFencedError,
    LedgerRecoveryError,
    NotEnoughBookiesError,
)
from aiobk.client.repair import BookieRepairer
from aiobk.metadata import free_port, open_store
from aiobk.protocol import AddRequest, DigestType, ReadFlag, ReadRequest, master_key
from aiobk.protocol.errors import CookieError
from aiobk.runner import make_bookie
from tests.support.cluster import Cluster, forget
from tests.support.dropping import DroppingConnector
from tests.support.names import unique_name

JOURNAL_LESS = {"journal_write_data": False, "allow_cookie_fix": True, "boot_repair": False}


async def _cluster(root: Path, protect: bool = True, **settings) -> Cluster:
    cluster = Cluster(
        root,
        f"memory://{unique_name('bp46')}",
        settings={**JOURNAL_LESS, "boot_fence": protect, "boot_limbo": protect, **settings},
    )
    for _ in range(3):
        await cluster.add_bookie(port=free_port())
    return cluster


def _is_add(address: str, entry: int):
    return lambda to, r: to == address and isinstance(r, AddRequest) and r.entry_id == entry


def _is_fencing(address: str):
    return lambda to, r: (
        to == address and isinstance(r, ReadRequest) and bool(r.flags & ReadFlag.FENCE)
    )


async def _five_entries_then_a_crash(
    cluster: Cluster, bk: BookKeeper
) -> tuple[LedgerHandle, Bookie]:
    """A ledger of five entries; the first bookie of its ensemble crashes, journal-less: the
    five unflushed entries are gone with it."""
    lh = await bk.create_ledger(3, 3, 2)
    for i in range(5):
        await lh.append(b"%d" % i)
    victim = cluster.by_id(lh.metadata.ensemble[0])
    await victim.crash()
    return lh, victim


async def test_cookies_refuse_a_wiped_bookie_unless_fixing_is_allowed(tmp_path: Path) -> None:
    uri = f"memory://{unique_name('cookie')}"
    config = BookieConfig(data_dir=str(tmp_path / "b"), port=free_port(), metadata_uri=uri)
    bookie = Bookie(config)
    await bookie.start()
    assert (tmp_path / "b" / "COOKIE").exists()
    assert (tmp_path / "b" / "journal" / "COOKIE").exists()
    store = open_store(uri)
    remote = await store.read_cookie(bookie.bookie_id)
    assert remote is not None
    assert remote.instance_id == bookie.booted.instance_id
    await bookie.stop()
    restarted = Bookie(config)  # same cookies: boots
    await restarted.start()
    await restarted.stop()
    shutil.rmtree(tmp_path / "b")  # the disk is replaced
    with pytest.raises(CookieError, match="has no cookie"):
        await Bookie(config).start()
    fixed = Bookie(config.with_changes(allow_cookie_fix=True))
    await fixed.start()
    assert fixed.booted.instance_id != remote.instance_id
    await fixed.stop()
    await store.close()
    forget(Cluster(tmp_path, uri))


async def test_unclean_journal_less_restart_fences_and_limbos_open_ledgers(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with await BookKeeper.connect(cluster.uri) as bk:
            lh, victim = await _five_entries_then_a_crash(cluster, bk)
            restarted = await cluster.restart(victim)
            assert restarted.booted.unclean_start
            assert restarted.booted.limbo_ledgers == [lh.ledger_id]
            state = restarted.storage.ledgers[lh.ledger_id]
            assert state.fenced
            assert state.limbo
            assert state.location(0) < 0  # really lost

            # The writer may land a few more adds on the two other bookies while it reconnects
            # to the restarted one, whose EFENCED then stops it. If the writer noticed the lost
            # connection first, it tries an ensemble change instead and, with no spare bookie in
            # this three-bookie cluster, stops with NotEnoughBookiesError. Either way it stops.
            async def write_until_fenced() -> None:
                for i in range(5, 200):
                    await lh.append(b"%d" % i)
                    await asyncio.sleep(0.005)

            with pytest.raises((LedgerFencedError, NotEnoughBookiesError)):
                await write_until_fenced()
            reader = await bk.open_ledger(lh.ledger_id, recovery=False)
            pool = bk.pool
            conn = await pool.get(restarted.bookie_id)
            answer = await conn.send(ReadRequest(conn.next_txn_id(), lh.ledger_id, 0), 5)
            assert answer.status.name == "EUNKNOWN"  # never NoSuchEntry while in limbo
            del reader
            await restarted.stop()  # clean stop: no limbo next time
            again = await cluster.restart(restarted)
            assert not again.booted.unclean_start
            assert again.booted.limbo_ledgers == []
    finally:
        await cluster.stop()
        forget(cluster)


async def test_without_a_repairer_limbo_ledgers_stay_in_limbo_and_it_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bookie never imports the client: the wiring hands it the repairer. A bookie built
    without one still fences and limbos (phase one is its own), skips phase two and says so
    once; limbo is the safe state (a lost entry is never reported as absent)."""
    cluster = await _cluster(tmp_path, boot_repair=True)
    try:
        async with await BookKeeper.connect(cluster.uri) as bk:
            lh, victim = await _five_entries_then_a_crash(cluster, bk)
            bare = Bookie(victim.config.with_changes(port=victim.address.port))
            cluster.bookies[cluster.bookies.index(victim)] = bare
            with caplog.at_level(logging.WARNING, logger="aiobk.bookie.repair"):
                await bare.start()
                await asyncio.wait_for(bare.wait_repaired(), 10)
            assert bare.booted.limbo_ledgers == [lh.ledger_id]
            assert bare.storage.ledgers[lh.ledger_id].limbo  # still: nobody repaired it
            said = [r.getMessage() for r in caplog.records if "no repairer" in r.getMessage()]
            assert len(said) == 1
            assert "1 ledger(s) stay in limbo" in said[0]
    finally:
        await cluster.stop()
        forget(cluster)


async def test_plain_read_of_a_limbo_gap_is_data_unknown(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with await BookKeeper.connect(cluster.uri) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            await lh.append(b"only")
            for bookie in list(cluster.bookies):
                await bookie.crash()
                await cluster.restart(bookie)
            rh = await bk.open_ledger(lh.ledger_id, recovery=False)
            with pytest.raises(DataUnknownError):
                await rh.read_unconfirmed(0, 0)
    finally:
        await cluster.stop()
        forget(cluster)


@pytest.mark.parametrize("protect", [True, False], ids=["protection-on", "protection-off"])
async def test_scenario_1_lost_fence_allows_writes_after_close(tmp_path: Path, protect) -> None:
    """BP-46 Scenario 1: C2's fence never reaches B3; C2 closes L1 at E1; B2 loses everything
    (its disk is replaced); C1 writes E2 to B2 and B3 -- B1 never answers -- and reaches AQ."""
    cluster = await _cluster(tmp_path, protect)
    c1_net = DroppingConnector()
    c2_net = DroppingConnector()
    config = ClientConfig(add_timeout=60.0, read_timeout=2.0)
    try:
        c1 = await BookKeeper.connect(cluster.uri, config, connector=c1_net)
        lh = await c1.create_ledger(3, 3, 2)
        b1, b2, b3 = (cluster.by_id(bid) for bid in lh.metadata.ensemble)
        assert await lh.append(b"E1") == 0  # reaches all three

        c2_net.rules.append(_is_fencing(b3.bookie_id))  # the fence to B3 is lost
        c2 = await BookKeeper.connect(cluster.uri, config, connector=c2_net)
        closed = await c2.open_ledger(lh.ledger_id)
        assert closed.metadata.last_entry_id == 0

        await b2.crash()  # B2 comes back with nothing: a replaced disk
        shutil.rmtree(b2.config.data_dir)
        await cluster.restart(b2)

        c1_net.rules.append(_is_add(b1.bookie_id, 1))  # B1 (fenced) never answers C1
        if protect:
            with pytest.raises(LedgerFencedError):
                await lh.append(b"E2")
        else:
            assert await lh.append(b"E2") == 1  # acknowledged after the close: lost
        await c1.close()
        await c2.close()
    finally:
        await cluster.stop()
        forget(cluster)


@pytest.mark.parametrize("protect", [True, False], ids=["protection-on", "protection-off"])
async def test_scenario_2_recovery_truncates_an_acknowledged_entry(tmp_path: Path, protect) -> None:
    """BP-46 Scenario 2: E0 is acknowledged by B1 and B3 (B2 never got it); B1 crashes and loses
    E0; C2 recovers and hears NoSuchEntry from B1 and B2 before B3 answers."""
    cluster = await _cluster(tmp_path, protect)
    c1_net = DroppingConnector()
    c2_net = DroppingConnector()
    # B3's answer is dropped and times out; B1's and B2's must come first: 2 s leaves room for
    # a loaded machine (1 s did not, with the suite run on two workers).
    config = ClientConfig(add_timeout=60.0, read_timeout=2.0)
    # C1 sends no explicit LAC: the scenario has no bookie knowing E0 is confirmed. With it
    # (0.1 s after the add) B3 knew LAC 0, and when B3's fence answer was among the first two,
    # recovery rightly started at E0 and needed B3's copy (a CI failure, 1 run in ~10).
    writer = ClientConfig(add_timeout=60.0, read_timeout=2.0, explicit_lac_delay=0)
    try:
        c1 = await BookKeeper.connect(cluster.uri, writer, connector=c1_net)
        lh = await c1.create_ledger(3, 3, 2)
        b1, b2, b3 = (cluster.by_id(bid) for bid in lh.metadata.ensemble)
        c1_net.rules.append(_is_add(b2.bookie_id, 0))  # B2 fails to respond
        assert await lh.append(b"E0") == 0  # confirmed by B1 and B3

        await b1.crash()  # journal-less: E0 was only in memory on B1
        b1 = await cluster.restart(b1)
        assert (
            b1.storage.ledgers.get(lh.ledger_id) is None
            or b1.storage.ledgers[lh.ledger_id].location(0) < 0
        )

        b3_read = lambda to, r: (  # noqa: E731 - B3's answer to the read of E0 comes too late
            to == b3.bookie_id and isinstance(r, ReadRequest) and r.entry_id == 0
        )
        c2_net.rules.append(b3_read)
        c2 = await BookKeeper.connect(cluster.uri, config, connector=c2_net)
        if protect:
            with pytest.raises(LedgerRecoveryError):  # B1 in limbo: "unknown", not "no"
                await c2.open_ledger(lh.ledger_id)
            c2_net.rules.remove(b3_read)
            rh = await c2.open_ledger(lh.ledger_id)  # once B3 answers: E0 recovered
            assert rh.metadata.last_entry_id == 0
            assert [e.data for e in await rh.read(0, 0)] == [b"E0"]
        else:
            rh = await c2.open_ledger(lh.ledger_id)
            assert rh.metadata.last_entry_id == -1  # the acknowledged E0 is truncated
        await c1.close()
        await c2.close()
    finally:
        await cluster.stop()
        forget(cluster)


async def test_cookie_show_and_fix_commands(etcd_server, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    def aiobk(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", "from aiobk.cli import main; main()", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    uri = etcd_server.uri(unique_name("cookiecli"))
    config = BookieConfig(data_dir=str(tmp_path / "b"), port=free_port(), metadata_uri=uri)
    bookie = Bookie(config)
    await bookie.start()
    bookie_id = bookie.bookie_id
    await bookie.stop()
    shown = await asyncio.to_thread(
        aiobk, "cookie", "show", "--data-dir", config.data_dir, "--bookie-id", bookie_id,
        "--metadata", uri,
    )  # fmt: skip
    document = json.loads(shown.stdout)
    assert document["metadata"]["instance_id"] == document[config.data_dir]["instance_id"]
    assert document["unclean_shutdown_marker"] is False

    shutil.rmtree(config.data_dir)
    with pytest.raises(CookieError, match="has no cookie"):
        await Bookie(config).start()
    fixed = await asyncio.to_thread(
        aiobk, "cookie", "fix", "--data-dir", config.data_dir, "--bookie-id", bookie_id,
        "--metadata", uri,
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr
    restarted = Bookie(config)
    await restarted.start()
    assert restarted.booted.unclean_start  # the fix left the marker: the boot assumed lost data
    await restarted.stop()
    missing = await asyncio.to_thread(aiobk, "cookie", "fix", "--data-dir", config.data_dir)
    assert missing.returncode != 0
    assert len(missing.stderr.strip().splitlines()) == 1


async def test_repair_recovers_copies_back_and_clears_limbo(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path, boot_repair=True, repair_retry_interval=0.05)
    try:
        async with await BookKeeper.connect(cluster.uri) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            for i in range(8):
                await lh.append(b"%d" % i)
            victim = cluster.by_id(lh.metadata.ensemble[2])
            await victim.crash()  # loses the 8 unflushed entries
            restarted = await cluster.restart(victim)
            assert restarted.booted.limbo_ledgers == [lh.ledger_id]
            await asyncio.wait_for(restarted.wait_repaired(), 30)
            metadata = await bk.store.read_ledger(lh.ledger_id)
            assert metadata.is_closed  # recovered by the bookie itself
            assert metadata.last_entry_id == 7
            state = restarted.storage.ledgers[lh.ledger_id]
            assert not state.limbo
            assert all(state.location(e) >= 0 for e in range(8))  # copied back from peers
            rh = await bk.open_ledger(lh.ledger_id)
            assert [e.data for e in await rh.read(0, 7)] == [b"%d" % i for i in range(8)]
    finally:
        await cluster.stop()
        forget(cluster)


async def test_a_wiped_bookie_gets_its_closed_ledgers_back(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path, boot_repair=True, repair_retry_interval=0.05)
    try:
        async with await BookKeeper.connect(cluster.uri) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            for i in range(6):
                await lh.append(b"%d" % i)
            await lh.close()
            victim = cluster.by_id(lh.metadata.ensemble[0])
            await victim.stop()
            shutil.rmtree(victim.config.data_dir)  # a new, empty disk
            restarted = await cluster.restart(victim)
            assert restarted.booted.limbo_ledgers == []  # closed: fenced, never in limbo
            state = restarted.storage.ledgers[lh.ledger_id]
            assert state.fenced
            await asyncio.wait_for(restarted.wait_repaired(), 30)
            assert all(state.location(e) >= 0 for e in range(6))
            conn = await bk.pool.get(restarted.bookie_id)
            body = Digester(DigestType.CRC32C).encode(lh.ledger_id, 6, 5, 100, b"stale")
            stale = AddRequest(
                conn.next_txn_id(), lh.ledger_id, 6, master_key=master_key(b""), body=body
            )
            assert (await conn.send(stale, 5)).status.name == "EFENCED"  # no write after close
    finally:
        await cluster.stop()
        forget(cluster)


async def test_force_on_a_journal_less_bookie_syncs_ledger_storage(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with await BookKeeper.connect(cluster.uri) as bk:
            lh = await bk.create_ledger(3, 3, 2, durability=Durability.VOLATILE)
            for i in range(10):
                await lh.append(b"%d" % i)
            checkpoints = [b.stats.checkpoints for b in cluster.bookies]
            assert await lh.force() == 9
            assert all(
                b.stats.checkpoints > c for b, c in zip(cluster.bookies, checkpoints, strict=True)
            )
            victim = cluster.by_id(lh.metadata.ensemble[0])
            await victim.crash()  # after force(): nothing of the 10 is lost
            restarted = await cluster.restart(victim)
            state = restarted.storage.ledgers[lh.ledger_id]
            assert all(state.location(e) >= 0 for e in range(10))
    finally:
        await cluster.stop()
        forget(cluster)


def test_the_wiring_hands_every_bookie_it_builds_the_client_repairer(tmp_path: Path) -> None:
    """``aiobk bookie start`` and ``aiobk standalone`` build bookies through ``aiobk.runner``,
    which passes the client's repairer (the bookie layer cannot import it)."""
    bookie = make_bookie(BookieConfig(data_dir=str(tmp_path)))
    repairer = bookie._make_repairer
    assert isinstance(repairer, functools.partial)
    assert repairer.func is BookieRepairer
    assert repairer.keywords == {"connector": None}  # plaintext: the config has no TLS
    assert Bookie(BookieConfig(data_dir=str(tmp_path)))._make_repairer is None
