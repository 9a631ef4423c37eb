"""Logs on ledgers (docs/design/logs.md) on real in-process bookies."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, Durability, LogPosition, LogReader, LogRecord
from aiobk.client.errors import LedgerFencedError, LogFencedError, NoSuchLogError
from tests.support.cluster import Cluster, forget, start_cluster
from tests.support.wait import wait_until


@pytest.fixture
async def logs_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 4)
    try:
        yield cluster
    finally:
        await cluster.stop()
        forget(cluster)


async def take(reader: LogReader, count: int, timeout: float = 20.0) -> list[LogRecord]:
    """The next ``count`` records of a (tailing) reader."""
    out: list[LogRecord] = []

    async def run() -> None:
        async for record in reader:
            out.append(record)
            if len(out) == count:
                return

    await asyncio.wait_for(run(), timeout)
    return out


async def test_append_then_read_back_in_order(logs_cluster: Cluster) -> None:
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        writer = await bk.open_log_writer("orders")
        positions = [await writer.append(b"r%d" % i) for i in range(50)]
        assert positions == sorted(positions)
        assert len({p.ledger_id for p in positions}) == 1
        await writer.close()
        records = await take(await bk.open_log_reader("orders"), 50)
        assert [r.data for r in records] == [b"r%d" % i for i in range(50)]
        assert [r.position for r in records] == positions
        assert [name async for name in bk.list_logs()] == ["orders"]


async def test_reader_tails_across_rolls(logs_cluster: Cluster) -> None:
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        writer = await bk.open_log_writer("tail", roll_bytes=600)
        reader = await bk.open_log_reader("tail")
        reading = asyncio.ensure_future(take(reader, 120))
        positions = []
        for i in range(120):
            positions.append(await writer.append(b"record-%04d" % i))  # 11 bytes
            if i % 10 == 0:
                await asyncio.sleep(0.01)  # pacing: the reader interleaves with the writer
        records = await reading
        assert [r.data for r in records] == [b"record-%04d" % i for i in range(120)]
        assert [r.position for r in records] == positions
        assert len({p.ledger_id for p in positions}) >= 2  # it rolled, invisibly
        await writer.close()  # after the roll its last append may have started
        written = sorted({p.ledger_id for p in positions})
        record = await bk.store.read_log("tail")
        assert list(record.ledgers[: len(written)]) == written
        assert len(record.ledgers) <= len(written) + 1  # and perhaps that roll's empty ledger


async def test_resume_from_a_saved_position(logs_cluster: Cluster) -> None:
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        writer = await bk.open_log_writer("resume", roll_bytes=100)
        for i in range(40):
            await writer.append(b"v%02d" % i)
        await writer.close()
        first = await take(await bk.open_log_reader("resume"), 17)
        saved = str(first[-1].position)  # what a consumer would store
        rest = await take(
            await bk.open_log_reader("resume", start=LogPosition.parse(saved).next()), 23
        )
        assert [r.data for r in first + rest] == [b"v%02d" % i for i in range(40)]


async def test_a_second_writer_fences_the_first(logs_cluster: Cluster) -> None:
    async with (
        await BookKeeper.connect(logs_cluster.uri) as bk1,
        await BookKeeper.connect(logs_cluster.uri) as bk2,
    ):
        w1 = await bk1.open_log_writer("race")
        acked = [await w1.append(b"w1-%d" % i) for i in range(10)]
        w2 = await bk2.open_log_writer("race")
        with pytest.raises(LogFencedError):
            await w1.append(b"too late")
        with pytest.raises(LedgerFencedError):  # and it stays fenced (same family)
            await w1.append(b"still too late")
        acked += [await w2.append(b"w2-%d" % i) for i in range(10)]
        await w2.close()
        records = await take(await bk2.open_log_reader("race"), 20)
        assert [r.position for r in records] == acked
        assert [r.data for r in records] == [b"w1-%d" % i for i in range(10)] + [
            b"w2-%d" % i for i in range(10)
        ]


async def test_writers_opening_at_once_leave_one_working_writer(logs_cluster: Cluster) -> None:
    clients = [await BookKeeper.connect(logs_cluster.uri) for _ in range(3)]
    try:
        opened = await asyncio.gather(
            *(bk.open_log_writer("crowd") for bk in clients), return_exceptions=True
        )
        writers = [w for w in opened if not isinstance(w, BaseException)]
        assert all(isinstance(e, LogFencedError) for e in opened if isinstance(e, BaseException))
        working = []
        for writer in writers:
            with contextlib.suppress(LedgerFencedError):
                working.append((writer, await writer.append(b"x")))
        assert len(working) == 1  # exactly one writer can complete appends
        records = await take(await clients[0].open_log_reader("crowd"), 1)
        assert records[0].position == working[0][1]
    finally:
        for bk in clients:
            await bk.close()


async def test_truncation_drops_whole_ledgers_below(logs_cluster: Cluster) -> None:
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        writer = await bk.open_log_writer("trunc", roll_bytes=30)
        positions = [await writer.append(b"t%02d" % i) for i in range(40)]
        ledgers = sorted({p.ledger_id for p in positions})
        assert len(ledgers) >= 3
        cut = next(p for p in positions if p.ledger_id == ledgers[2])
        removed = await bk.truncate_log("trunc", before=cut)
        assert removed == ledgers[:2]
        log_ledgers = list((await bk.store.read_log("trunc")).ledgers)
        # ... then what the writer rolled to after its last append, if that roll is done.
        assert log_ledgers[: len(ledgers) - 2] == ledgers[2:]
        assert len(log_ledgers) <= len(ledgers) - 1
        remaining = [i async for i in bk.list_ledgers()]
        assert not set(removed) & set(remaining)
        kept = [p for p in positions if p.ledger_id >= ledgers[2]]
        records = await take(await bk.open_log_reader("trunc"), len(kept))
        assert [r.position for r in records] == kept
        # Never the last ledger, which the writer is using.
        current = (await bk.store.read_log("trunc")).ledgers  # it may have rolled once more
        assert await bk.truncate_log("trunc", before=LogPosition(10**12, 0)) == list(current[:-1])
        assert await writer.append(b"after") > positions[-1]
        await writer.close()


async def test_a_killed_writer_is_taken_over_without_losing_acked_records(
    logs_cluster: Cluster,
) -> None:
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        doomed = await BookKeeper.connect(logs_cluster.uri)
        writer = await doomed.open_log_writer("takeover")
        acked: list[LogPosition] = []

        async def write() -> None:
            for i in range(10_000):
                acked.append(await writer.append(b"a%05d" % i))

        task = asyncio.ensure_future(write())
        await wait_until(lambda: len(acked) >= 200, every=0.01, timeout=30, what="200 acked")
        task.cancel()  # the process dies: no close, connections just drop
        await doomed.pool.close()
        successor = await bk.open_log_writer("takeover")
        after = await successor.append(b"next")
        assert after > acked[-1]
        # Appends in flight when it died may have made it too: read up to the successor's.
        records: list[LogRecord] = []

        async def until_after() -> None:
            async for record in await bk.open_log_reader("takeover"):
                records.append(record)
                if record.position == after:
                    return

        await asyncio.wait_for(until_after(), 20)
        got = {r.position: r.data for r in records}
        assert len(got) == len(records)  # no position twice
        assert all(got[p] == b"a%05d" % i for i, p in enumerate(acked))
        assert got[after] == b"next"
        data = [r.data for r in records[:-1]]
        assert data == [b"a%05d" % i for i in range(len(data))]  # a prefix: no gap, no dup
        await successor.close()
        await doomed.close()


async def test_a_failed_ledger_rolls_over_without_loss_or_duplicates(
    logs_cluster: Cluster,
) -> None:
    """A volatile ledger cannot change its ensemble: losing a bookie fails it. The writer
    recovers it, resolves its in-flight appends against the recovered end, and goes on in a
    new ledger; the appender sees only positions."""
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        writer = await bk.open_log_writer("failover", durability=Durability.VOLATILE)
        first_ledger = writer.ledger_id
        metadata = (await bk.store.read_ledger(first_ledger)).ensemble
        victim = logs_cluster.by_id(metadata[0])
        results = []

        async def append(i: int) -> None:
            results.append((i, await writer.append(b"f%03d" % i)))

        tasks = [asyncio.ensure_future(append(i)) for i in range(30)]
        await asyncio.sleep(0)
        await victim.crash()
        tasks += [asyncio.ensure_future(append(i)) for i in range(30, 60)]
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert writer.ledger_id != first_ledger
        by_position = sorted((p, i) for i, p in results)
        assert len({p for p, _ in by_position}) == 60  # no two records at one position
        assert [i for _, i in by_position] == list(range(60))  # positions in call order
        await writer.close()
        records = await take(await bk.open_log_reader("failover"), 60)
        assert sorted(r.data for r in records) == sorted(b"f%03d" % i for i in range(60))
        assert {r.position: r.data for r in records} == {p: b"f%03d" % i for p, i in by_position}


async def test_unknown_log(logs_cluster: Cluster) -> None:
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        with pytest.raises(NoSuchLogError):
            await bk.open_log_reader("nope")
        with pytest.raises(NoSuchLogError):
            await bk.open_log_writer("nope", create=False)
        with pytest.raises(ValueError, match="LEDGER:ENTRY"):
            LogPosition.parse("12")


async def test_the_writer_rolls_by_age(logs_cluster: Cluster) -> None:
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        writer = await bk.open_log_writer("aged", roll_seconds=0.2)
        first = await writer.append(b"old")
        await asyncio.sleep(0.3)  # roll_seconds must pass: age is time
        await writer.append(b"due")  # this append finds the ledger too old: a roll starts
        later = await writer.append(b"new")
        assert later.ledger_id > first.ledger_id
        await writer.close()
        records = await take(await bk.open_log_reader("aged"), 3)
        assert [r.data for r in records] == [b"old", b"due", b"new"]


async def wait_until_readable(bk: BookKeeper, name: str, last: LogPosition) -> None:
    """Until the bookies report ``last`` confirmed (a quiet writer sends its LAC explicitly)."""
    handle = await bk.open_ledger(last.ledger_id, recovery=False)

    async def confirmed() -> bool:
        return await handle.read_last_add_confirmed() >= last.entry_id

    await wait_until(confirmed, every=0.02, timeout=10, what=f"{last} confirmed")


async def test_a_reader_that_does_not_follow_stops_at_the_end_it_saw(
    logs_cluster: Cluster,
) -> None:
    """``open_log_reader(follow=False)`` reads to the end of the log as it is when
    opened -- every ledger then, the last up to its bookies' LAC then -- and stops, while the
    writer keeps appending (a following reader never ends)."""
    async with await BookKeeper.connect(logs_cluster.uri) as bk:
        writer = await bk.open_log_writer("ends", roll_bytes=40)
        positions = [await writer.append(b"e%02d" % i) for i in range(30)]
        assert len({p.ledger_id for p in positions}) >= 3
        await wait_until_readable(bk, "ends", positions[-1])
        reader = await bk.open_log_reader("ends", follow=False)
        assert reader.end == positions[-1]
        later = [await writer.append(b"late%d" % i) for i in range(3)]  # after the open
        records = [r async for r in reader]
        assert [r.position for r in records] == positions
        assert [r.data for r in records] == [b"e%02d" % i for i in range(30)]
        assert reader.position == positions[-1].next()  # resumes inside the live ledger
        # From a saved position, to a new end.
        await wait_until_readable(bk, "ends", later[-1])
        resumed = await bk.open_log_reader("ends", start=reader.position, follow=False)
        assert [r.position async for r in resumed] == later
        beyond = await bk.open_log_reader("ends", start=later[-1].next(), follow=False)
        assert [r async for r in beyond] == []
        await writer.close()
        # A log whose last ledger is empty (a writer just took over): the end is before it.
        successor = await bk.open_log_writer("ends")
        reader = await bk.open_log_reader("ends", follow=False)
        assert reader.end == later[-1]
        assert len([r async for r in reader]) == 33
        await successor.close()
        empty = await bk.open_log_writer("empty")
        assert [r async for r in await bk.open_log_reader("empty", follow=False)] == []
        await empty.close()
        with pytest.raises(NoSuchLogError):
            await bk.open_log_reader("nope", follow=False)


def test_log_position_text_form() -> None:
    """``LEDGER:ENTRY`` both ways, and ``earliest`` for EARLIEST; nothing else."""
    assert str(LogPosition(12, 0)) == "12:0"
    assert LogPosition.parse("12:0") == LogPosition(12, 0)
    assert LogPosition.parse(str(LogPosition(7, 123))) == LogPosition(7, 123)
    assert str(LogPosition.EARLIEST) == "earliest"
    assert LogPosition.parse("earliest") is LogPosition.EARLIEST
    assert LogPosition.parse("EARLIEST") is LogPosition.EARLIEST
    for bad in ("12", "-1:0", "1:-2", "1:2:3", "a:b", "", "1_0:2", "+1:2", "1 :2", "\u0661:\u0662"):
        with pytest.raises(ValueError, match="LEDGER:ENTRY or earliest"):
            LogPosition.parse(bad)
