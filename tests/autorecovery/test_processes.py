"""Autorecovery with real processes, end to end: a real etcd and five bookie processes,
each running AutoRecovery beside it with fast settings. A bookie is SIGKILLed and its
directory deleted, so it never returns: within a bounded time no ledger names it and no mark
is left, every entry has a copy on every bookie its write set names, and every entry reads with
any two of the four survivors stopped. Then the same with the auditor as the victim: another
bookie takes the seat within the lease's TTL and the repair still completes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, ClientConfig
from aiobk.client.entry_read import ask
from aiobk.metadata import EtcdProcess, MetadataStore, write_set
from aiobk.protocol import StatusCode
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess
from tests.support.wait import wait_until

BOOKIES = 5
LEDGERS = 6
ENTRIES = 40
LEASE_TTL = 2.0
# etcd raises registration_ttl to its minimum (2 s with default timing).
FAST: dict[str, float] = {"registration_ttl": 1.0}
AUTORECOVERY: dict[str, float] = {  # the [autorecovery] table
    "lost_bookie_recovery_delay": 1.5,
    "autorecovery_poll_interval": 0.2,
    "rereplication_retry_delay": 0.2,
    "autorecovery_lease_ttl": LEASE_TTL,
    "open_ledger_rereplication_grace_period": 1.0,
}
REPAIR_BOUND = 60.0  # seconds from the kill until nothing names the victim and no mark is left
# A reader that meets stopped bookies: a connect unanswered (the kernel accepts into the backlog,
# the stopped process never answers) or a read unanswered costs little before the next bookie.
READER = ClientConfig(read_timeout=1.0, speculative_read_timeout=0.1, connect_timeout=0.5)


def _payload(ledger_index: int, entry_id: int) -> bytes:
    return b"ledger %d entry %d " % (ledger_index, entry_id) + bytes(200)


class Cluster:
    """Five bookie processes registered in one etcd prefix, autorecovery on in each."""

    def __init__(self, root: Path, uri: str) -> None:
        self.uri = uri
        self.procs: dict[str, BookieProcess] = {}
        for i in range(BOOKIES):
            data = root / f"bookie{i}"
            config = root / f"bookie{i}.toml"
            settings = {**HOST_DISK_SETTINGS, **FAST}
            config.write_text(
                "".join(f"{k} = {v!r}\n" for k, v in settings.items())
                + "[autorecovery]\n"
                + "".join(f"{k} = {v!r}\n" for k, v in AUTORECOVERY.items())
            )
            proc = BookieProcess(data, None, "--metadata", uri, "--config", str(config))
            self.procs[f"127.0.0.1:{proc.port}"] = proc

    async def start(self) -> None:
        await asyncio.gather(*(p.start() for p in self.procs.values()))

    def kill_for_good(self, bookie_id: str) -> None:
        """SIGKILL, then delete its data: it never comes back."""
        proc = self.procs.pop(bookie_id)
        proc.kill()
        shutil.rmtree(proc.data_dir)

    def send(self, bookie_ids: tuple[str, ...], signum: signal.Signals) -> None:
        for bookie_id in bookie_ids:
            process = self.procs[bookie_id].process
            assert process is not None
            process.send_signal(signum)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.process.send_signal(signal.SIGCONT)
            proc.stop()


@pytest.fixture
async def cluster(etcd_server: EtcdProcess, tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(tmp_path, etcd_server.uri(unique_name("autorecovery-procs")))
    try:
        await cluster.start()
        yield cluster
    finally:
        cluster.stop()


async def _write_ledgers(bk: BookKeeper, count: int, first: int = 0) -> list[int]:
    """``count`` closed ledgers; the one at ``first + i`` of the caller's list holds
    ``_payload(first + i, ...)``, as ``_read_everything`` expects."""
    ids = []
    for index in range(first, first + count):
        lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await asyncio.gather(*(lh.append(_payload(index, i)) for i in range(ENTRIES)))
        await lh.close()
        ids.append(lh.ledger_id)
    return ids


async def _named_by(store: MetadataStore, ids: list[int]) -> dict[str, list[int]]:
    """Bookie -> the ledgers (of ``ids``) whose ensembles name it."""
    named: dict[str, list[int]] = {}
    for ledger_id in ids:
        metadata = await store.read_ledger(ledger_id)
        for bookie in {b for f in metadata.fragments for b in f.ensemble}:
            named.setdefault(bookie, []).append(ledger_id)
    return named


async def _wait_repaired(store: MetadataStore, ids: list[int], victim: str) -> float:
    """Poll until no ledger names ``victim`` and no mark is left; the seconds it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    left: list[object] = []

    async def repaired() -> bool:
        named = (await _named_by(store, ids)).get(victim, [])
        marks = [m async for m in store.autorecovery.marks()]
        left[:] = [named, marks]
        return not named and not marks

    try:
        await wait_until(repaired, every=0.2, timeout=REPAIR_BOUND, what=f"{victim} replaced")
    except AssertionError:
        raise AssertionError(f"not repaired in {REPAIR_BOUND}s: {victim} still in {left}") from None
    return loop.time() - start


async def _check_copies(bk: BookKeeper, ids: list[int], alive: set[str]) -> None:
    """Every entry is on each bookie its fragment's write set names, and each is alive."""
    for ledger_id in ids:
        metadata = await bk.store.read_ledger(ledger_id)
        assert metadata.last_entry_id == ENTRIES - 1
        for entry_id in range(ENTRIES):
            fragment = metadata.fragment_for(entry_id)
            for slot in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum):
                bookie = fragment.ensemble[slot]
                assert bookie in alive, (ledger_id, entry_id, bookie)
                response = await ask(bk.pool, bookie, ledger_id, entry_id, 5.0)
                assert response.status is StatusCode.EOK, (ledger_id, entry_id, bookie)


async def _read_everything(uri: str, ids: list[int]) -> None:
    """Every entry of every ledger, byte for byte, through a fresh client."""
    async with await BookKeeper.connect(uri, READER) as bk:
        for index, ledger_id in enumerate(ids):
            rh = await bk.open_ledger(ledger_id, recovery=False)
            entries = await asyncio.wait_for(rh.read(0, ENTRIES - 1), 30)
            assert [e.data for e in entries] == [_payload(index, i) for i in range(ENTRIES)]


@pytest.mark.timeout(150)
async def test_a_bookie_killed_and_wiped_is_replaced_and_any_two_survivors_may_fail(
    cluster: Cluster,
) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        ids = await _write_ledgers(bk, LEDGERS)
        named = await _named_by(bk.store, ids)
        victim = max(sorted(named), key=lambda b: len(named[b]))
        assert named[victim], named
        cluster.kill_for_good(victim)
        took = await _wait_repaired(bk.store, ids, victim)
        print(f"repaired {len(named[victim])} ledgers {took:.1f}s after the kill")
        await _check_copies(bk, ids, set(cluster.procs))
    survivors = sorted(cluster.procs)
    assert len(survivors) == BOOKIES - 1
    loop = asyncio.get_running_loop()
    for pair in itertools.combinations(survivors, 2):
        started = loop.time()
        cluster.send(pair, signal.SIGSTOP)
        try:
            await _read_everything(cluster.uri, ids)
        finally:
            cluster.send(pair, signal.SIGCONT)
        print(f"read everything with {pair} stopped in {loop.time() - started:.1f}s")


@pytest.mark.timeout(150)
async def test_the_auditor_killed_and_wiped_is_succeeded_and_its_copies_come_back(
    cluster: Cluster,
) -> None:
    loop = asyncio.get_running_loop()
    async with await BookKeeper.connect(cluster.uri) as bk:
        marks = bk.store.autorecovery
        auditor: str | None = None

        async def elected() -> bool:
            nonlocal auditor
            auditor = await marks.auditor()
            return auditor is not None

        # The first election: a poll interval or so after the starts.
        await wait_until(elected, every=0.1, timeout=10, what="an auditor elected")
        assert auditor in cluster.procs, auditor
        ids: list[int] = []
        for _round in range(4):  # placement is random: write until the auditor holds copies
            ids += await _write_ledgers(bk, 3, first=len(ids))
            if len((await _named_by(bk.store, ids)).get(auditor, [])) >= 2:
                break
        assert (await _named_by(bk.store, ids)).get(auditor), "the auditor holds no ledger"
        cluster.kill_for_good(auditor)
        killed = loop.time()
        successor: str | None = None

        async def succeeded() -> bool:
            nonlocal successor
            successor = await marks.auditor()
            return successor not in (None, auditor)

        await wait_until(succeeded, timeout=10, what=f"a successor to {auditor}")
        took_over = loop.time() - killed
        # The lease lapses at most its TTL after the last refresh; then etcd's expiry sweep
        # (every 0.5 s) and a candidate's next look (a jittered poll interval) follow.
        assert successor in cluster.procs, (auditor, successor)
        assert took_over <= LEASE_TTL + 1.5, took_over
        await _wait_repaired(bk.store, ids, auditor)
        took = loop.time() - killed
        print(f"{successor} took over in {took_over:.1f}s; repaired {took:.1f}s after the kill")
        await _check_copies(bk, ids, set(cluster.procs))
    await _read_everything(cluster.uri, ids)
