"""Logs of envelope records: a key, headers and a time per record, read back as
written; raw logs as before; a log's format fixed at creation; the time search's answers and
its cost."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import ENVELOPE, RAW, BookKeeper, LogPosition, LogRecord, RecordFormatError
from aiobk.client.log.by_time import position_at_time
from aiobk.client.log.writer import LogWriterSettings, open_log_writer
from tests.support.cluster import Cluster, forget, start_cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    started = await start_cluster(tmp_path, 3)
    try:
        yield started
    finally:
        await started.stop()
        forget(started)


async def read_all(bk: BookKeeper, name: str, start: LogPosition = LogPosition.EARLIEST):
    return [r async for r in await bk.open_log_reader(name, start, follow=False)]


async def test_envelope_records_come_back_with_key_headers_and_time(cluster: Cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        # A fixed clock: the default stamp is the writer's clock, in ms.
        settings = LogWriterSettings(record_format=ENVELOPE, clock=lambda: 1_700_000_000.5)
        async with await open_log_writer(bk, "events", settings) as writer:
            first = await writer.append(b"a", key=b"user-1", headers={"type": b"click"})
            await writer.append(b"b", timestamp=42)
            await writer.append(b"c", key=b"")
        records = await read_all(bk, "events")
        assert records == [
            LogRecord(first, b"a", b"user-1", {"type": b"click"}, 1_700_000_000_500),
            LogRecord(first.next(), b"b", None, {}, 42),
            LogRecord(LogPosition(first.ledger_id, 2), b"c", b"", {}, 1_700_000_000_500),
        ]
        tail = [r async for r in await bk.open_log_reader("events", first.next(), follow=False)]
        assert [r.data for r in tail] == [b"b", b"c"]
        # Following readers decode too.
        reader = await bk.open_log_reader("events")
        async for record in reader:
            assert record.key == b"user-1"
            break
        # The ledger holds the envelope: the documented layout, 15 bytes before the key.
        handle = await bk.open_ledger(first.ledger_id, recovery=False)
        (entry,) = await handle.read(0, 0)
        assert entry.data[0] == 0xE1
        assert entry.data.endswith(b"a")


async def test_raw_logs_stay_raw_and_refuse_record_fields(cluster: Cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        async with await bk.open_log_writer("plain", record_format=RAW) as writer:
            await writer.append(b"x")
            with pytest.raises(ValueError, match="holds raw records"):
                await writer.append(b"y", key=b"k")
            with pytest.raises(ValueError, match="holds raw records"):
                await writer.append(b"y", timestamp=1)
        (record,) = await read_all(bk, "plain")
        assert (record.data, record.key, record.headers, record.timestamp) == (b"x", None, {}, None)
        # The stored record of a raw log is what older releases wrote: no format field.
        raw = json.loads((await bk.store.kv.get(bk.store.keys.log("plain")))[0].value)
        assert "record_format" not in raw
        # A log's format is fixed when it is created.
        with pytest.raises(ValueError, match="holds raw records, not envelope"):
            await bk.open_log_writer("plain", record_format=ENVELOPE)
        with pytest.raises(ValueError, match="unknown log record format"):
            await bk.open_log_writer("other", record_format="zstd")
        assert [name async for name in bk.list_logs()] == ["plain"]
        # Asking for nothing takes the log's format.
        async with await bk.open_log_writer("events2", record_format=ENVELOPE):
            pass
        async with await bk.open_log_writer("events2") as writer:
            assert writer.record_format == ENVELOPE
            await writer.append(b"z", timestamp=7)
        (record,) = await read_all(bk, "events2")
        assert record.timestamp == 7


async def test_an_entry_that_is_no_envelope_is_named_by_its_position(cluster: Cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        async with await bk.open_log_writer("mixed", record_format=ENVELOPE) as writer:
            pos = await writer.append(b"ok", timestamp=1)
        # A ledger written by hand into the log, not through a writer of this format.
        lh = await bk.create_ledger()
        await lh.append(b"not an envelope")
        await lh.close()
        record = await bk.store.read_log("mixed")
        await bk.store.write_log(record.with_ledgers((*record.ledgers, lh.ledger_id)))
        reader = await bk.open_log_reader("mixed", follow=False)
        seen = []

        async def read() -> None:
            async for r in reader:
                seen.append(r.position)

        with pytest.raises(RecordFormatError, match=f"the record at {lh.ledger_id}:0"):
            await read()
        assert seen == [pos]


async def test_the_time_search_finds_the_first_record_at_or_after_a_time(
    cluster: Cluster,
) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        # 6 ledgers (one empty, made by a writer that appended nothing) of 40 records, stamps
        # 10 ms apart, several records sharing a stamp.
        stamps: list[tuple[LogPosition, int]] = []
        t = 1000
        for ledger in range(6):
            async with await bk.open_log_writer("t", record_format=ENVELOPE) as writer:
                if ledger == 3:
                    continue
                for i in range(40):
                    stamps.append((await writer.append(b"%d" % i, timestamp=t), t))
                    t += 10 if i % 3 else 0
        total = len(stamps)
        for wanted in (0, 1000, 1001, 1010, 1500, 1777, stamps[120][1], stamps[-1][1], t + 1):
            expected = next((p for p, s in stamps if s >= wanted), None)
            stats: dict[str, int] = {}
            assert await position_at_time(bk, "t", wanted, stats=stats) == expected, wanted
            # log2(6 ledgers) + log2(40 entries) probes, and each ledger's last entry once.
            assert stats["reads"] <= 6 + 7, (wanted, stats)
        assert total == 200
        assert await bk.log_position_at_time("t", 0) == stamps[0][0]
        # A truncated log: the search starts at what remains.
        await bk.truncate_log("t", before=stamps[80][0])
        assert await bk.log_position_at_time("t", 0) == stamps[80][0]


async def test_raw_logs_have_no_time_to_search(cluster: Cluster) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        async with await bk.open_log_writer("raw", record_format=RAW) as writer:
            await writer.append(b"x")
        with pytest.raises(ValueError, match="carry no timestamp"):
            await bk.log_position_at_time("raw", 0)
