"""Exactly-once appends across a producer killed for real: a writer process (tests/support/
producer.py) appends dense sequences with 32 in flight and is SIGKILLed mid-stream -- early,
after its log has rolled, late; a second process with the same producer id learns
``last_sequence``, sends again the last 50 sequences the first was asked to send, and goes on to
the end. Bookies and etcd are processes too. The log must hold every sequence once, in order,
and every record the first process saw acknowledged where it was acknowledged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, LogRecord
from aiobk.metadata import EtcdProcess
from aiobk.protocol.errors import LogFencedError
from tests.support.names import unique_name
from tests.support.procs import BookieProcess
from tests.support.producer import ProducerProcess, payload

FINAL = 1500  # sequences in the log at the end
RESENT = 50  # the second process starts this many below the first one's last send
ROLL_BYTES = 4096  # about 40 records a ledger: the log rolls every few dozen appends
KILL_AFTER = {"early": 10, "after-a-roll": 200, "late": 1200}  # acknowledgements seen


@pytest.fixture
async def metadata(etcd_server: EtcdProcess, tmp_path: Path) -> AsyncIterator[str]:
    """Three bookie processes registered under a fresh prefix of the session's etcd."""
    uri = etcd_server.uri(unique_name("producers"))
    bookies = [BookieProcess(tmp_path / f"bookie{i}", None, "--metadata", uri) for i in range(3)]
    try:
        await asyncio.gather(*(bookie.start() for bookie in bookies))
        yield uri
    finally:
        for bookie in bookies:
            bookie.stop()


async def read_log(uri: str, name: str) -> list[LogRecord]:
    async with await BookKeeper.connect(uri) as bk:
        reader = await bk.open_log_reader(name, follow=False)
        return [record async for record in reader]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kill_point", list(KILL_AFTER))
async def test_a_producer_killed_mid_stream_is_resumed_by_another_process_exactly_once(
    metadata: str, kill_point: str
) -> None:
    first = ProducerProcess(metadata, "stream", "svc", end=FINAL, roll_bytes=ROLL_BYTES)
    await first.launch()
    try:
        await first.until(lambda: len(first.acked) >= KILL_AFTER[kill_point], timeout=40)
    finally:
        first.kill()
    assert await first.wait() != 0
    assert first.last_sequence == -1
    assert first.sent == list(range(len(first.sent)))
    ledgers = {ledger for ledger, _entry in first.acked.values()}
    if kill_point == "early":
        assert len(ledgers) == 1
    else:
        assert len(ledgers) > 1, "the log rolled before the kill"
    asked = first.sent[-1]
    assert asked < FINAL - RESENT

    second = ProducerProcess(
        metadata, "stream", "svc", start=max(0, asked - RESENT + 1), end=FINAL,
        roll_bytes=ROLL_BYTES,
    )  # fmt: skip
    await second.launch()
    async with asyncio.timeout(40):
        assert await second.wait() == 0
    assert second.done
    last = second.last_sequence
    assert last is not None
    assert max(first.acked) <= last <= asked, "the log holds every acknowledged sequence"
    assert sorted(second.dups) == list(range(second.start, last + 1))
    assert sorted(second.acked) == list(range(last + 1, FINAL))

    records = await read_log(metadata, "stream")
    assert [r.sequence for r in records] == list(range(FINAL)), "each once, in order"
    assert {r.producer_id for r in records} == {"svc"}
    assert all(r.data == payload(s) for s, r in enumerate(records))
    at = {(r.position.ledger_id, r.position.entry_id): r.sequence for r in records}
    for acked in (first.acked, second.acked):
        assert all(at.get(position) == sequence for sequence, position in acked.items())


@pytest.mark.timeout(90)
async def test_a_producer_whose_writer_is_taken_opens_another_and_sends_again_what_it_was_unsure_of(
    metadata: str,
) -> None:
    """A second writer of the same producer takes the log mid-stream (as one started while the
    first seemed dead): the process's writer is fenced, it opens another with the same id and
    sends again from its first unacknowledged sequence; nothing lands twice."""
    process = ProducerProcess(metadata, "taken", "svc", end=FINAL, roll_bytes=ROLL_BYTES)
    await process.launch()
    try:
        await process.until(lambda: len(process.acked) >= 300, timeout=40)
        async with await BookKeeper.connect(metadata) as bk:
            usurper = await bk.open_log_writer("taken", producer_id="svc")
            assert max(process.acked) <= usurper.last_sequence <= process.sent[-1]
            await process.until(lambda: bool(process.reopened), timeout=40)
            with pytest.raises(LogFencedError):
                await usurper.append(b"late", sequence=usurper.last_sequence + 1)
        async with asyncio.timeout(40):
            assert await process.wait() == 0
    finally:
        process.kill()
    assert process.done
    assert len(process.reopened) == 1
    records = await read_log(metadata, "taken")
    assert [r.sequence for r in records] == list(range(FINAL)), "each once, in order"
    assert all(r.data == payload(s) for s, r in enumerate(records))
    at = {(r.position.ledger_id, r.position.entry_id): r.sequence for r in records}
    assert all(at.get(position) == sequence for sequence, position in process.acked.items())
    assert set(process.acked) | set(process.dups) == set(range(FINAL))
