"""A log writer under routine operations: retention racing its rolls, and positions that follow
the order of ``append`` calls across rolls (docs/design/logs.md), on real in-process bookies."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookKeeper, LogPosition, LogWriter
from aiobk.client.errors import LogFencedError, NoSuchLedgerError
from aiobk.client.log.writer import _Append, split_at
from aiobk.metadata import LogMetadata
from aiobk.metadata.etcd_process import EtcdProcess
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    """Four bookies on a real etcd: its compare-and-set takes long enough for a roll and a
    truncation to overlap."""
    cluster = await start_cluster(tmp_path, 4, uri=etcd_server.uri(unique_name("logorder")))
    try:
        yield cluster
    finally:
        await cluster.stop()


async def paced_appends(
    writer: LogWriter, count: int, *, gap: float, in_flight: int, size: int = 64
) -> list[LogPosition]:
    """``count`` appends called in order, one every ``gap`` seconds, at most ``in_flight`` of
    them unfinished: a service's pace. Their positions, in call order."""
    slots = asyncio.Semaphore(in_flight)
    tasks: list[asyncio.Task[LogPosition]] = []

    async def one(index: int) -> LogPosition:
        try:
            return await writer.append(b"%08d" % index + b"." * (size - 8))
        finally:
            slots.release()

    for index in range(count):
        await slots.acquire()
        tasks.append(asyncio.create_task(one(index)))  # called now: its place in the order
        await asyncio.sleep(gap)
    return list(await asyncio.gather(*tasks))


def out_of_order(positions: list[LogPosition]) -> list[tuple[int, LogPosition, LogPosition]]:
    return [
        (index, earlier, later)
        for index, (earlier, later) in enumerate(itertools.pairwise(positions))
        if later <= earlier
    ]


@pytest.mark.timeout(120)
async def test_retention_truncating_during_rolls_never_fails_the_writer(cluster: Cluster) -> None:
    """Truncation changes the log record by compare-and-set as a roll does; a roll that loses
    that race must try again, not take it for another writer."""
    async with (
        await BookKeeper.connect(cluster.uri) as bk,
        await BookKeeper.connect(cluster.uri) as retention,
    ):
        writer = await bk.open_log_writer("kept", roll_bytes=8192)
        stop = asyncio.Event()
        truncations = 0

        async def truncate_forever() -> None:
            nonlocal truncations
            while not stop.is_set():
                record = await retention.store.read_log("kept")
                before = LogPosition(record.ledgers[-1], 0)
                truncations += bool(await retention.truncate_log("kept", before=before))
                await asyncio.sleep(0.01)  # pacing: truncations keep coming while appends run

        truncating = asyncio.create_task(truncate_forever())
        try:
            positions = await paced_appends(writer, 3000, gap=0.001, in_flight=64, size=256)
        finally:
            stop.set()
            await truncating
        assert truncations > 20
        assert len({p.ledger_id for p in positions}) > 50  # it rolled all along
        record = await bk.store.read_log("kept")
        assert record.ledgers[-1] == positions[-1].ledger_id
        await writer.close()


@pytest.mark.timeout(60)
async def test_a_roll_that_loses_its_race_to_a_truncation_tries_again(cluster: Cluster) -> None:
    """The exact interleaving: the log changes (a truncation) between the roll's read of the
    log record and its compare-and-set."""
    async with (
        await BookKeeper.connect(cluster.uri) as bk,
        await BookKeeper.connect(cluster.uri) as retention,
    ):
        writer = await bk.open_log_writer("raced", roll_bytes=100)
        store = bk.store
        read_log = store.read_log
        raced = 0

        async def read_then_truncate(name: str) -> LogMetadata:
            nonlocal raced
            record = await read_log(name)
            if len(record.ledgers) >= 2:  # a roll read it: change it under the roll
                before = LogPosition(record.ledgers[-1], 0)
                raced += len(await retention.truncate_log(name, before=before))
            return record

        store.read_log = read_then_truncate  # type: ignore[method-assign]
        positions = [await writer.append(b"r" * 100) for _ in range(6)]
        assert raced >= 3
        assert len({p.ledger_id for p in positions}) == 6
        await writer.close()  # after the roll that the last append started
        store.read_log = read_log  # type: ignore[method-assign]
        record = await bk.store.read_log("raced")
        assert record.ledgers[0] == positions[-1].ledger_id
        assert len(record.ledgers) == 2  # and the ledger it rolled to, empty


async def test_a_truncation_that_loses_races_to_rolls_checks_passwords_once(
    cluster: Cluster,
) -> None:
    """Retention under a busy writer: every roll changes the log record, so a truncation may
    lose its compare-and-set several times. Each retry only reads and writes the record; the
    ledgers' passwords are checked once (re-reading a hundred ledgers' metadata on every try
    made retention lose to rolls every ~0.6 s for good)."""
    async with (
        await BookKeeper.connect(cluster.uri) as bk,
        await BookKeeper.connect(cluster.uri) as retention,
    ):
        writer = await bk.open_log_writer("busy", roll_bytes=100)
        positions = [await writer.append(b"r" * 100) for _ in range(12)]
        store = retention.store
        write_log, read_ledger = store.write_log, store.read_ledger
        lost, reads = 0, 0

        async def roll_first(record: LogMetadata) -> LogMetadata:
            nonlocal lost
            if lost < 3:  # the writer rolls between the truncation's read and its write
                lost += 1
                await writer.append(b"r" * 100)
            return await write_log(record)

        async def counted(ledger_id: int) -> Any:
            nonlocal reads
            reads += 1
            return await read_ledger(ledger_id)

        delete_ledger = store.delete_ledger
        deleting, most = 0, 0

        async def concurrent(ledger_id: int, version: int | None = None) -> None:
            nonlocal deleting, most
            deleting += 1
            most = max(most, deleting)
            try:
                await delete_ledger(ledger_id, version)
            finally:
                deleting -= 1

        store.write_log = roll_first  # type: ignore[method-assign]
        store.read_ledger = counted  # type: ignore[method-assign]
        store.delete_ledger = concurrent  # type: ignore[method-assign]
        removed = await retention.truncate_log("busy", before=positions[-1])
        assert lost == 3
        assert len(removed) == 11
        assert reads == len(removed)
        assert most > 1  # the ledgers are deleted several at a time, not one after another
        for ledger_id in removed:
            with pytest.raises(NoSuchLedgerError):
                await bk.store.read_ledger(ledger_id)
        await writer.close()


@pytest.mark.timeout(120)
async def test_positions_follow_call_order_across_rolls(cluster: Cluster) -> None:
    """Appends called while a roll runs wait for it; one called just after it finished must
    not overtake them."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        writer = await bk.open_log_writer("ordered", roll_bytes=16384)
        positions = await paced_appends(writer, 4000, gap=0.001, in_flight=64)
        assert len({p.ledger_id for p in positions}) > 10
        assert out_of_order(positions) == []
        await writer.close()
        reader = await bk.open_log_reader("ordered", follow=False)
        assert [record.position async for record in reader] == positions


@pytest.mark.timeout(60)
async def test_an_append_called_during_a_roll_waits_behind_earlier_calls(cluster: Cluster) -> None:
    """Exactly the shape seen at a roll: calls made while the roll runs, then one made the
    moment it finished; all land in call order."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        writer = await bk.open_log_writer("edge", roll_bytes=100)
        first = await writer.append(b"a" * 100)  # crosses roll_bytes: a roll starts
        waiting = [asyncio.create_task(writer.append(b"w%d" % i)) for i in range(5)]
        await asyncio.sleep(0)
        ledger = writer.ledger_id
        await wait_until(  # the roll finishes ...
            lambda: writer.ledger_id != ledger, every=0, what="the roll finished"
        )
        late = await writer.append(b"late")  # ... and a call right after it
        positions = [first, *await asyncio.gather(*waiting), late]
        assert out_of_order(positions) == []
        await writer.close()


@pytest.mark.timeout(60)
async def test_a_takeover_still_fences_the_writer_at_once(cluster: Cluster) -> None:
    async with (
        await BookKeeper.connect(cluster.uri) as bk,
        await BookKeeper.connect(cluster.uri) as other,
    ):
        writer = await bk.open_log_writer("taken", roll_bytes=1 << 20)
        before = await writer.append(b"before")
        second = await other.open_log_writer("taken")
        with pytest.raises(LogFencedError):
            await writer.append(b"after")
        with pytest.raises(LogFencedError):
            await writer.append(b"after again")
        assert (await second.append(b"second")) > before
        with contextlib.suppress(LogFencedError):
            await writer.close()
        await second.close()


@pytest.mark.timeout(60)
async def test_a_ledger_recovered_by_someone_else_is_not_a_takeover(cluster: Cluster) -> None:
    """An operator recovering the writer's ledger (``aiobk ledger read --recover``) fences it,
    but the log is still this writer's: it moves on to a new ledger, losing nothing."""
    async with (
        await BookKeeper.connect(cluster.uri) as bk,
        await BookKeeper.connect(cluster.uri) as operator,
    ):
        writer = await bk.open_log_writer("recovered", roll_bytes=1 << 20)
        taken_with = writer.ledger_id
        before = [await writer.append(b"b%d" % i) for i in range(5)]
        fenced = writer.ledger_id
        await operator.open_ledger(fenced, recovery=True)
        after = await paced_appends(writer, 200, gap=0.0005, in_flight=16)
        assert writer.ledger_id != fenced
        positions = before + after
        assert out_of_order(positions) == []
        await writer.close()
        reader = await bk.open_log_reader("recovered", follow=False)
        records = [record async for record in reader]
        assert [r.position for r in records] == positions
        assert (await bk.store.read_log("recovered")).writer == taken_with  # still its own


def test_a_sealed_ledger_splits_its_appends_at_its_last_entry() -> None:
    """What a roll or failover learns from the sealed ledger: appends up to its last entry are
    in the log; those after it are sent again, in their order; settled ones are left alone."""
    loop = asyncio.new_event_loop()
    try:
        sent = deque()
        for entry_id in range(6):
            append = _Append(b"%d" % entry_id, loop.create_future())
            append.entry_id = entry_id
            append.settled = entry_id == 0
            sent.append(append)
        kept, again = split_at(sent, 3)
        assert [a.entry_id for a in kept] == [1, 2, 3]
        assert [a.entry_id for a in again] == [4, 5]
        assert split_at(sent, -1) == ([], list(sent)[1:])
    finally:
        loop.close()
