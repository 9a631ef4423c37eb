"""Producers: a log writer opened with a producer id appends each sequence once, across crashes,
takeovers, rolls and other writers (docs/design/logs.md), on real in-process bookies; and the
pure parts (the envelope's version 2, the producer table, the log record's field)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, ClientConfig, LogPosition, LogRecord
from aiobk.client.config import ProtocolSwitches
from aiobk.client.log.append import append_ledgers_to_log
from aiobk.client.log.format import (
    RecordFormatError,
    check_producer_id,
    decode,
    encode,
    timestamp_of,
)
from aiobk.client.log.position import log_record
from aiobk.client.log.producers import MAX_PRODUCERS, ProducerTable
from aiobk.commands.records import entry_line, record_line
from aiobk.metadata import LogMetadata, ProducerState
from tests.support.cluster import Cluster, start_cluster

# ---------------------------------------------------------------- pure parts


def test_a_produced_record_round_trips_in_version_2_and_a_plain_one_stays_version_1() -> None:
    body = encode(b"data", 1234, b"k", {"h": b"v"}, b"svc", 7)
    assert body[0] == 0xE2
    record = decode(body)
    assert (record.data, record.timestamp, record.key, dict(record.headers)) == (
        b"data", 1234, b"k", {"h": b"v"},
    )  # fmt: skip
    assert (record.producer_id, record.sequence) == ("svc", 7)
    assert timestamp_of(body) == 1234
    plain = encode(b"data", 1234)
    assert plain[0] == 0xE1
    assert (decode(plain).producer_id, decode(plain).sequence) == (None, None)
    bare = decode(encode(b"", -5, None, None, b"p", 0))
    assert (bare.data, bare.key, bare.headers, bare.sequence) == (b"", None, {}, 0)


def test_a_bad_producer_field_is_a_one_line_error() -> None:
    body = encode(b"data", 1, None, None, b"svc", 7)
    for broken in (body[:20], body[:15] + b"\0" + body[16:]):
        with pytest.raises(RecordFormatError) as caught:
            decode(broken)
        assert "\n" not in str(caught.value)
    with pytest.raises(RecordFormatError, match="sequence -1"):
        encode(b"", 1, None, None, b"p", -1)
    with pytest.raises(ValueError, match="1 to 255 bytes"):
        check_producer_id("")
    with pytest.raises(ValueError, match="1 to 255 bytes"):
        check_producer_id("x" * 256)


def test_the_table_forgets_silent_producers_and_keeps_a_bounded_number() -> None:
    table = ProducerTable()
    table.saw("old", 5, 1_000)
    table.saw("new", 9, 50_000)
    table.saw("new", 3, 40_000)  # an earlier sequence never lowers the last one
    assert table.last_sequence("new") == 9
    state = table.state(as_of=12, now=60_000, retention=20_000, keep=None)
    assert state == ProducerState(12, {"new": (9, 50_000)})
    assert table.last_sequence("old") == -1
    table.saw("mine", 1, 0)
    assert "mine" in table.state(as_of=13, now=60_000, retention=20_000, keep="mine").last
    crowd = ProducerTable({f"p{i}": (i, i) for i in range(MAX_PRODUCERS + 10)})
    crowd.saw("mine", 0, -1)
    kept = crowd.state(as_of=1, now=0, retention=10**9, keep="mine").last
    assert len(kept) == MAX_PRODUCERS
    assert "mine" in kept
    assert "p0" not in kept


def test_the_log_record_keeps_its_producers_and_reads_records_without_them() -> None:
    record = LogMetadata("l", (3, 4), record_format="envelope", writer=4,
                         producers=ProducerState(4, {"a": (7, 99)}))  # fmt: skip
    again = LogMetadata.from_json(record.to_json())
    assert again.producers == ProducerState(4, {"a": (7, 99)})
    assert LogMetadata.from_json(LogMetadata("l", (3,)).to_json()).producers is None
    assert record.with_ledgers((4,)).producers == record.producers
    assert record.taken((4, 5), 5).producers == record.producers


# ---------------------------------------------------------------- on bookies


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 3)
    try:
        yield cluster
    finally:
        await cluster.stop()


async def read_all(bk: BookKeeper, name: str) -> list[LogRecord]:
    reader = await bk.open_log_reader(name, follow=False)
    return [record async for record in reader]


def sequences(records: list[LogRecord], producer: str) -> list[int]:
    return [r.sequence for r in records if r.producer_id == producer and r.sequence is not None]


@pytest.mark.timeout(60)
async def test_a_producer_numbers_its_records_and_a_new_writer_learns_the_last(
    cluster: Cluster,
) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        async with await bk.open_log_writer("orders", producer_id="svc") as writer:
            assert writer.last_sequence == -1
            for index in range(10):
                assert isinstance(await writer.append(b"%d" % index), LogPosition)
            assert writer.last_sequence == 9
        async with await bk.open_log_writer("orders", producer_id="svc") as writer:
            assert writer.last_sequence == 9
            assert await writer.append(b"again", sequence=5) is None
            assert await writer.append(b"again", sequence=9) is None
            assert isinstance(await writer.append(b"10", sequence=10), LogPosition)
            assert isinstance(await writer.append(b"20", sequence=20), LogPosition)  # a gap
            assert writer.last_sequence == 20
        records = await read_all(bk, "orders")
        assert sequences(records, "svc") == [*range(11), 20]
        assert [r.data for r in records[:2]] == [b"0", b"1"]


@pytest.mark.timeout(60)
async def test_an_abandoned_writer_with_appends_in_flight_is_resumed_exactly_once(
    cluster: Cluster,
) -> None:
    """The writer is dropped with 32 appends unfinished (as a process killed mid-stream); the
    next writer of the producer re-sends the last 50 and every sequence is there once."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        first = await bk.open_log_writer("stream", producer_id="svc", roll_bytes=2048)
        done = [await first.append(b"%06d" % s, sequence=s) for s in range(100)]
        assert all(isinstance(p, LogPosition) for p in done)
        flying = [asyncio.create_task(first.append(b"%06d" % s, sequence=s))
                  for s in range(100, 132)]  # fmt: skip
        await asyncio.sleep(0)
        async with await BookKeeper.connect(cluster.uri) as bk2:
            second = await bk2.open_log_writer("stream", producer_id="svc", roll_bytes=2048)
            resume = second.last_sequence
            assert 99 <= resume <= 131
            for s in range(max(0, resume - 49), 150):
                await second.append(b"%06d" % s, sequence=s)
            await second.close()
        await asyncio.gather(*flying, return_exceptions=True)
        record = await bk.store.read_log("stream")
        assert record.producers is not None
        assert record.producers.as_of == record.ledgers[-1]  # a next writer reads one ledger
        records = await read_all(bk, "stream")
        assert sequences(records, "svc") == list(range(150))
        assert [int(r.data) for r in records] == list(range(150))


@pytest.mark.timeout(60)
async def test_producers_take_turns_and_a_plain_writer_or_a_sink_keeps_what_they_know(
    cluster: Cluster,
) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        async with await bk.open_log_writer("shared", producer_id="a", roll_bytes=512) as a:
            for _ in range(30):
                await a.append(b"a" * 40)
        async with await bk.open_log_writer("shared", producer_id="b") as b:
            assert b.last_sequence == -1
            for _ in range(5):
                await b.append(b"b")
        async with await bk.open_log_writer("shared", roll_bytes=512) as plain:
            for _ in range(30):
                await plain.append(b"p" * 40)
        sink = await bk.create_ledger(3, 3, 2)
        await sink.append(b"\xe1" + bytes(14))  # an envelope without a producer
        await sink.close()
        await append_ledgers_to_log(bk, "shared", [sink.ledger_id])
        record = await bk.store.read_log("shared")
        assert record.producers is not None
        assert record.producers.as_of == sink.ledger_id  # nothing before it is read again
        assert {p: v[0] for p, v in record.producers.last.items()} == {"a": 29, "b": 4}
        async with await bk.open_log_writer("shared", producer_id="a") as a:
            assert a.last_sequence == 29
        async with await bk.open_log_writer("shared", producer_id="b") as b:
            assert b.last_sequence == 4


@pytest.mark.timeout(60)
async def test_a_duplicate_in_flight_waits_for_the_first_and_plain_misuse_is_refused(
    cluster: Cluster,
) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        async with await bk.open_log_writer("dups", producer_id="svc") as writer:
            first = asyncio.create_task(writer.append(b"x", sequence=3))
            await asyncio.sleep(0)
            again = asyncio.create_task(writer.append(b"x", sequence=3))
            position, duplicate = await asyncio.gather(first, again)
            assert isinstance(position, LogPosition)
            assert duplicate is None
            assert writer.last_sequence == 3
        async with await bk.open_log_writer("dups") as plain:
            with pytest.raises(ValueError, match="needs a writer opened with a producer_id"):
                await plain.append(b"x", sequence=1)
        with pytest.raises(ValueError, match="needs a log created with record_format"):
            await bk.open_log_writer("raw", record_format="raw", producer_id="svc")
        with pytest.raises(ValueError, match="1 to 255 bytes"):
            await bk.open_log_writer("dups", producer_id="")
        assert sequences(await read_all(bk, "dups"), "svc") == [3]


@pytest.mark.timeout(60)
async def test_a_producer_silent_past_its_retention_is_forgotten(cluster: Cluster) -> None:
    now = [1_000_000.0]
    async with await BookKeeper.connect(cluster.uri, wall_clock=lambda: now[0]) as bk:
        async with await bk.open_log_writer("quiet", producer_id="gone") as writer:
            await writer.append(b"x")
        now[0] += 30
        async with await bk.open_log_writer("quiet", producer_id="live", producer_retention=60):
            pass
        record = await bk.store.read_log("quiet")
        assert record.producers is not None
        assert set(record.producers.last) == {"gone", "live"}
        now[0] += 31  # 61 s since "gone" was last seen, 31 since "live"
        async with await bk.open_log_writer("quiet", producer_id="live", producer_retention=60):
            pass
        record = await bk.store.read_log("quiet")
        assert record.producers is not None
        assert set(record.producers.last) == {"live"}
        async with await bk.open_log_writer("quiet", producer_id="gone") as back:
            assert back.last_sequence == -1


@pytest.mark.timeout(60)
async def test_with_deduplication_switched_off_a_resent_sequence_lands_twice(
    cluster: Cluster,
) -> None:
    """The protection the simulator's producer campaign switches off, shown once directly."""
    off = ClientConfig(switches=ProtocolSwitches(deduplicate_producers=False))
    async with await BookKeeper.connect(cluster.uri) as bk:
        writer = await bk.open_log_writer("twice", producer_id="svc")
        await writer.append(b"0", sequence=0)
        await writer.close()
    async with await BookKeeper.connect(cluster.uri, off) as bk:
        async with await bk.open_log_writer("twice", producer_id="svc") as writer:
            assert writer.last_sequence == -1
            assert isinstance(await writer.append(b"0", sequence=0), LogPosition)
        assert sequences(await read_all(bk, "twice"), "svc") == [0, 0]


def test_the_json_lines_of_log_tail_and_ledger_read_name_the_producer() -> None:
    body = encode(b"d", 0, None, None, b"svc", 4)
    line = json.loads(record_line(log_record(LogPosition(3, 1), body, "envelope"), as_json=True))
    assert (line["producer_id"], line["sequence"]) == ("svc", 4)
    entry = json.loads(entry_line(1, body, True, decode(body)))
    assert (entry["record"]["producer_id"], entry["record"]["sequence"]) == ("svc", 4)
    plain = encode(b"d", 0)
    assert "producer_id" not in record_line(log_record(LogPosition(3, 1), plain, "envelope"), True)


@pytest.mark.timeout(60)
async def test_opening_reads_a_bounded_amount_whatever_the_log_length(cluster: Cluster) -> None:
    """Thirty ledgers of a producer's records, then a crash (no close): the next writer of the
    producer reads one entry -- the last of the ledger the crashed writer was writing."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        first = await bk.open_log_writer("long", producer_id="svc", roll_bytes=256)
        for _ in range(300):
            await first.append(b"x" * 30)
        assert len((await bk.store.read_log("long")).ledgers) >= 30
    async with await BookKeeper.connect(cluster.uri) as bk:
        before = bk.stats.entries_read
        second = await bk.open_log_writer("long", producer_id="svc")
        assert second.last_sequence == 299
        assert bk.stats.entries_read - before <= 1
        await second.close()


@pytest.mark.timeout(60)
async def test_a_duplicate_of_a_cancelled_call_waits_for_the_record_it_left(
    cluster: Cluster,
) -> None:
    """Cancelling a caller cancels only its wait: the record is still appended, and the same
    sequence sent again on the same writer is a duplicate that returns None once it is in."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        async with await bk.open_log_writer("cancel", producer_id="svc") as writer:
            call = asyncio.create_task(writer.append(b"x", sequence=0))
            await asyncio.sleep(0)
            call.cancel()
            assert await writer.append(b"x", sequence=0) is None
            assert writer.last_sequence == 0
        assert sequences(await read_all(bk, "cancel"), "svc") == [0]
