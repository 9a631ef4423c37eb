"""A cluster beyond one host: three "hosts" on loopback -- 127.0.0.2, .3 and .4,
which Linux routes to ``lo`` as it does 127.0.0.1 -- each running a bookie process and a member
of a 3-member etcd cluster. Every process is given all three etcd endpoints, as in production.

A log writer appends continuously (its ledgers roll every few dozen records, so it writes to
the metadata store all the time) and a reader tails it, each through a client of its own.
Mid-stream the etcd leader is SIGKILLed; it is also the first endpoint every process talks to,
so every client and bookie loses its etcd connection while the two members left elect a new
leader. Appends and the tail must carry on within bounded pauses, no acknowledged record may be
lost or duplicated, and the bookies stay registered. Then the member comes back and rejoins.

The pauses, as measured here (etcd 3.4) and what bounds them:

- A write sent to a member while the cluster has no leader is not refused: etcd holds it until
  the client's deadline, even once a new leader is elected. So the writer's first metadata
  write after the kill (the close of its ledger at the next roll) waits out
  ``metadata_timeout``, fails over and is retried (``metadata_retry_timeout``): about 5 s.
- The tail's watch of its ledger's metadata (which ends its long poll at the close) loses its
  stream with the member and reconnects to the next endpoint; it sees the close once the
  writer's retried write lands: a pause about as long as the writer's. (Before the watch moved
  on by itself it retried the dead member until ``long_poll_timeout``, 10 s, ended the poll.)

The kill lands while the writer is in the middle of a ledger: the close of its next roll then
meets the election and is retried (a roll's ledger creation and log-record update are retried
the same way: tests/client/test_metadata_retry.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, ClientConfig, LogPosition
from aiobk.metadata import free_port, open_store
from aiobk.metadata.etcd_process import EtcdCluster
from tests.support.procs import BookieProcess
from tests.support.wait import wait_until

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
LOG = "multi-host"
ROLL_BYTES = 4096  # a new ledger every ~40 records: ledger creations and CASes all the time
RECORD_PADDING = 80
MAX_RECORDS = 20_000  # the writer's and the tail's bound whatever the clock says
RECORDS_PER_PHASE = 40  # acks (and tailed records) wanted in each phase before moving on
CONFIG = ClientConfig()  # the defaults, on purpose: what an application gets
ELECTION = 4.0  # an election (1-2 s with etcd's defaults) and a retry's backoff, with margin
WRITER_PAUSE = CONFIG.metadata_timeout + ELECTION  # see the module doc
TAIL_PAUSE = WRITER_PAUSE
PHASE_BOUND = TAIL_PAUSE + 10.0  # longest any one phase below may take


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(hosts=HOSTS, data_dir=str(tmp_path / "etcd")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
async def bookies(tmp_path: Path, etcd_cluster: EtcdCluster) -> AsyncIterator[list[BookieProcess]]:
    """One bookie process per host, listening (and so registered) on that host's address; all
    name every etcd member, the leader first."""
    uri = etcd_cluster.uri(first=etcd_cluster.leader())
    procs = [
        BookieProcess(
            tmp_path / f"bookie-{host}", free_port(host), "--host", host, "--metadata", uri
        )
        for host in HOSTS
    ]
    try:
        await asyncio.gather(*(proc.start() for proc in procs))
        yield procs
    finally:
        for proc in procs:
            proc.stop()  # SIGKILL: what they hold is the test's temporary directory


async def registered(uri: str) -> dict[str, str]:
    async with open_store(uri) as store:
        return {b.bookie_id: b.address for b in await store.list_bookies()}


def longest_pause(times: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


@pytest.mark.timeout(60)
async def test_losing_an_etcd_member_mid_stream_loses_nothing(
    etcd_cluster: EtcdCluster, bookies: list[BookieProcess]
) -> None:
    leader = etcd_cluster.leader()
    assert leader is not None
    uri = etcd_cluster.uri(first=leader)
    assert uri.count(",") == 2
    # Each host's bookie is registered under its own address (its id: that host:port).
    expected = {
        f"{host}:{proc.port}": f"{host}:{proc.port}"
        for host, proc in zip(HOSTS, bookies, strict=True)
    }
    assert await registered(uri) == expected

    loop = asyncio.get_running_loop()
    acked: list[tuple[LogPosition, bytes, float]] = []
    tailed: list[tuple[LogPosition, bytes, float]] = []
    stop_writing = asyncio.Event()

    async with BookKeeper(uri, CONFIG) as writer_bk, BookKeeper(uri, CONFIG) as reader_bk:
        writer = await writer_bk.open_log_writer(LOG, roll_bytes=ROLL_BYTES)
        reader = await reader_bk.open_log_reader(LOG)

        async def write() -> None:
            for i in range(MAX_RECORDS):
                if stop_writing.is_set():
                    return
                data = f"record {i:06d} ".encode() + bytes(RECORD_PADDING)
                position = await writer.append(data)
                acked.append((position, data, loop.time()))

        async def tail() -> None:
            async for record in reader:
                tailed.append((record.position, record.data, loop.time()))
                if len(tailed) >= MAX_RECORDS:
                    return

        writing = asyncio.create_task(write())
        tailing = asyncio.create_task(tail())

        def alive() -> None:
            for task in (writing, tailing):
                if task.done():
                    task.result()  # raises what stopped it
                    raise AssertionError("the writer or the tail stopped early")

        def progressed(count: int, past_ledger: int = -1) -> Callable[[], bool]:
            """Both past ``count`` records and into a ledger after ``past_ledger`` (and neither
            stopped: its error shows)."""

            def check() -> bool:
                alive()
                return (
                    len(acked) >= count
                    and len(tailed) >= count
                    and tailed[-1][0].ledger_id > past_ledger
                )

            return check

        def mid_ledger() -> bool:
            alive()
            return bool(acked) and 2 <= acked[-1][0].entry_id <= 10

        try:
            await wait_until(
                progressed(RECORDS_PER_PHASE), timeout=30, what="appends and the tail under way"
            )

            # The leader, which every client and bookie talks to, dies while the writer is
            # early in a ledger: its next roll meets the election (see the module doc).
            await wait_until(mid_ledger, timeout=PHASE_BOUND, what="the writer early in a ledger")
            before_kill = len(acked)
            last_ledger_before = acked[-1][0].ledger_id
            killed_at = loop.time()
            leader.kill()
            new_leader = await asyncio.to_thread(etcd_cluster.wait_leader, PHASE_BOUND)
            assert new_leader is not leader
            assert len(etcd_cluster.running) == 2
            await wait_until(
                # ... and ledgers kept rolling: the store took writes through the members left
                progressed(before_kill + RECORDS_PER_PHASE, past_ledger=last_ledger_before),
                timeout=PHASE_BOUND,
                what="appends and the tail carry on after the leader's kill",
            )

            # The member comes back (its data, its ports), rejoins, and the stream still flows.
            await asyncio.to_thread(leader.start)
            assert len(etcd_cluster.running) == 3
            back = len(acked)
            await wait_until(
                progressed(back + RECORDS_PER_PHASE),
                timeout=PHASE_BOUND,
                what="appends and the tail after the rejoin",
            )
        finally:
            stop_writing.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writing, PHASE_BOUND)
            await writer.close()
        writing.result()  # the writer stopped because it was told to

        # The tail reaches every acknowledged record, in order, once each.
        await wait_until(
            lambda: len(tailed) >= len(acked), timeout=TAIL_PAUSE, what="the tail catches up"
        )
        tailing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tailing
        records = [(p, d) for p, d, _t in acked]
        assert [p for p, _d in records] == sorted({p for p, _d in records})
        assert [(p, d) for p, d, _t in tailed] == records

        # So does a fresh reader of the whole log, through the member that was killed first.
        async with BookKeeper(etcd_cluster.uri(first=leader), CONFIG) as check_bk:
            full = await check_bk.open_log_reader(LOG, follow=False)
            assert [(r.position, r.data) async for r in full] == records

    # Bounded pauses, across the kill as anywhere else.
    assert any(t > killed_at for _p, _d, t in acked)
    assert longest_pause([t for _p, _d, t in acked]) < WRITER_PAUSE
    assert longest_pause([t for _p, _d, t in tailed]) < TAIL_PAUSE

    # Every bookie is still registered under its own address, as the CLI shows it.
    found: dict[str, str] = {}

    async def all_registered() -> bool:
        found.clear()
        found.update(await registered(uri))
        return found == expected

    try:
        await wait_until(all_registered, every=0.2, timeout=PHASE_BOUND, what="every bookie")
    except AssertionError:
        raise AssertionError(f"registered {found}, expected {expected}") from None
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiobk", "bookies", "list", "--json", "--metadata", uri,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _err = await asyncio.wait_for(cli.communicate(), PHASE_BOUND)
    assert cli.returncode == 0
    assert {row["id"]: row["address"] for row in json.loads(out)} == expected
