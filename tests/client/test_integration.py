"""The client against real bookies (processes, or in process) and a real etcd."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, ClientConfig
from aiobk.client.errors import BKError, LedgerFencedError
from tests.support.cluster import start_cluster
from tests.support.names import unique_name
from tests.support.procs import BookieProcess
from tests.support.wait import wait_until


@pytest.mark.timeout(180)
async def test_ten_thousand_pipelined_appends_then_reopen(etcd_server, tmp_path: Path) -> None:
    uri = etcd_server.uri(unique_name("bulk"))
    cluster = await start_cluster(tmp_path, 3, uri=uri)
    try:
        async with await BookKeeper.connect(uri) as bk:
            lh = await bk.create_ledger(3, 3, 2, password=b"pw")
            ids = await asyncio.gather(*(lh.append(b"%08d" % i * 8) for i in range(10_000)))
            assert ids == list(range(10_000))
            await lh.close()
        async with await BookKeeper.connect(uri) as bk:
            rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
            assert rh.last_add_confirmed == 9_999
            entries = await rh.read(0, 9_999)
            assert [e.data for e in entries] == [b"%08d" % i * 8 for i in range(10_000)]
    finally:
        await cluster.stop()


@pytest.mark.timeout(240)
async def test_sigkill_an_ensemble_bookie_mid_stream(etcd_server, tmp_path: Path) -> None:
    uri = etcd_server.uri(unique_name("kill"))
    procs = [BookieProcess(tmp_path / f"b{i}", None, "--metadata", uri) for i in range(4)]
    for proc in procs:
        await proc.start()
    try:
        config = ClientConfig(add_timeout=5.0)
        async with await BookKeeper.connect(uri, config) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            victim_id = lh.metadata.ensemble[1]
            victim = next(p for p in procs if f"127.0.0.1:{p.port}" == victim_id)
            acked: list[int] = []
            window = asyncio.Semaphore(64)

            async def append(i: int) -> None:
                async with window:
                    acked.append(await lh.append(b"v%d" % i))

            tasks = [asyncio.ensure_future(append(i)) for i in range(3000)]
            await wait_until(
                lambda: len(acked) >= 1000, every=0.001, timeout=60, what="1000 adds acked"
            )
            victim.kill()  # mid-stream: ~1000 acknowledged, more in flight
            await asyncio.gather(*tasks)
            assert sorted(acked) == list(range(3000))  # writes went on through the change
            assert len(lh.metadata.fragments) >= 2
            assert victim_id not in lh.metadata.ensemble
            await lh.close()
        async with await BookKeeper.connect(uri) as bk:
            rh = await bk.open_ledger(lh.ledger_id)
            entries = await rh.read(0, 2999)
            assert [e.data for e in entries] == [b"v%d" % i for i in range(3000)]
    finally:
        for proc in procs:
            proc.stop()


async def test_writer_fenced_by_a_concurrent_open(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as writer_bk:
        lh = await writer_bk.create_ledger(3, 3, 2)
        stop = asyncio.Event()
        acked: list[int] = []
        failures: list[BKError] = []

        async def keep_writing() -> None:
            for i in range(100_000):
                if stop.is_set():
                    return
                try:
                    acked.append(await lh.append(b"%d" % i))
                except BKError as exc:
                    failures.append(exc)
                    return

        writing = asyncio.ensure_future(keep_writing())
        await wait_until(lambda: len(acked) >= 50, every=0.01, timeout=30, what="50 adds acked")
        async with await BookKeeper.connect(cluster.uri) as reader_bk:
            rh = await reader_bk.open_ledger(lh.ledger_id)
            await asyncio.wait_for(writing, 30)
            stop.set()
            assert failures
            assert isinstance(failures[0], LedgerFencedError)
            assert rh.metadata.last_entry_id is not None
            assert rh.metadata.last_entry_id >= max(acked)  # no acknowledged entry truncated
            data = [e.data for e in await rh.read(0, max(acked))]
            assert data == [b"%d" % i for i in range(max(acked) + 1)]


async def test_long_poll_wakes_on_a_new_add(cluster) -> None:
    # No explicit LAC from the idle writer: it would wake the poll before the new add does.
    async with await BookKeeper.connect(cluster.uri, ClientConfig(explicit_lac_delay=0)) as bk:
        lh = await bk.create_ledger(3, 3, 2)
        await lh.append(b"a")
        await lh.append(b"b")
        rh = await bk.open_ledger(lh.ledger_id, recovery=False)
        assert rh.last_add_confirmed == 0
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(rh.wait_for_lac(0, timeout=20))
        await wait_until(
            lambda: sum(b.stats.long_polls for b in cluster.bookies) >= 1,
            every=0.01,
            what="the long poll waits at a bookie",
        )
        assert not waiting.done()
        started = loop.time()
        await lh.append(b"c")  # carries LAC 1
        assert await asyncio.wait_for(waiting, 10) >= 1
        assert loop.time() - started < 5
        tail = []

        async def follow() -> None:
            async for entry in rh.read_from(0):
                tail.append(entry.data)

        following = asyncio.ensure_future(follow())
        await lh.append(b"d")
        await lh.close()
        await asyncio.wait_for(following, 20)
        assert tail == [b"a", b"b", b"c", b"d"]


async def test_fence_survives_a_restart_of_every_bookie(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as writer_bk:
        lh = await writer_bk.create_ledger(3, 3, 2)
        for i in range(5):
            await lh.append(b"%d" % i)
        async with await BookKeeper.connect(cluster.uri) as reader_bk:
            await reader_bk.open_ledger(lh.ledger_id)
        for bookie in list(cluster.bookies):
            await bookie.crash()
            await cluster.restart(bookie)
        with pytest.raises(LedgerFencedError):
            await lh.append(b"stale")


async def test_fence_then_delete_then_a_stale_add(cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as writer_bk:
        lh = await writer_bk.create_ledger(3, 3, 2)
        await lh.append(b"a")
        async with await BookKeeper.connect(cluster.uri) as other:
            await other.open_ledger(lh.ledger_id)
            await other.delete_ledger(lh.ledger_id)
            assert [i async for i in other.list_ledgers()] == []
        with pytest.raises(LedgerFencedError):
            await lh.append(b"stale")
