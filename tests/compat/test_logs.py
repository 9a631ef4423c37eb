"""Logs across versions, as a rolling upgrade mixes them: this tree reading what a release's
writer wrote and taking the log over from it; a release's reader reading what this tree's writer
wrote; a release's writer or truncation acting on a log this tree's writer holds."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aiobk import BookKeeper, LogPosition, errors
from aiobk.bookie import Bookie
from tests.compat.driver import run_steps
from tests.compat.harness import Release


def records(tag: str, count: int, keyed: bool = False) -> list[dict[str, Any]]:
    if not keyed:
        return [{"data": f"{tag}-{i}"} for i in range(count)]
    return [
        {"data": f"{tag}-{i}", "key": f"k{i % 3}", "headers": {"h": f"v{i}"}} for i in range(count)
    ]


def as_read(written: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a reader returns for ``written`` (no key, no headers when none were given)."""
    return [
        {"data": r["data"], "key": r.get("key"), "headers": r.get("headers", {})} for r in written
    ]


def contents(read: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: r[k] for k in ("data", "key", "headers")} for r in read["records"]]


def positions(read: dict[str, Any]) -> list[list[int]]:
    return [r["position"] for r in read["records"]]


@pytest.fixture
async def cluster(head_bookies: Callable[..., Awaitable[list[Bookie]]]) -> list[Bookie]:
    return await head_bookies(3)


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("cluster")
async def test_head_reads_and_takes_over_release_logs(
    release: Release, uri: str, client: BookKeeper
) -> None:
    orders, events = records("o", 10), records("e", 10, keyed=True)
    written = await release.run(uri, [
        {"op": "log_write", "log": "events", "records": events,
         "options": {"record_format": "envelope"}},
        # Rolling every few records, and left open by a writer that dies.
        {"op": "log_write", "log": "orders", "records": orders, "options": {"roll_bytes": 12},
         "close": False},
        {"op": "exit"},
    ])  # fmt: skip
    events_at, orders_at = written[0]["positions"], written[1]["positions"]
    assert len({ledger for ledger, _ in orders_at}) > 1

    read = await run_steps(client, [
        {"op": "log_read", "log": "orders"},
        {"op": "log_read", "log": "events"},
        # This tree's writer takes each log over and appends after the release's records.
        {"op": "log_write", "log": "orders", "records": records("o2", 5)},
        {"op": "log_write", "log": "events", "records": records("e2", 5, keyed=True)},
        {"op": "log_read", "log": "orders"},
        {"op": "log_read", "log": "events"},
    ])  # fmt: skip
    assert contents(read[0]) == as_read(orders)
    assert positions(read[0]) == orders_at
    assert contents(read[1]) == as_read(events)
    assert positions(read[1]) == events_at
    assert min(read[2]["positions"]) > max(orders_at)
    assert min(read[3]["positions"]) > max(events_at)
    all_orders, all_events = orders + records("o2", 5), events + records("e2", 5, keyed=True)
    assert contents(read[4]) == as_read(all_orders)
    assert contents(read[5]) == as_read(all_events)

    # The release's reader on the logs as this tree's writer left them.
    again = await release.run(uri, [
        {"op": "log_read", "log": "orders"}, {"op": "log_read", "log": "events"},
    ])  # fmt: skip
    assert again == read[4:]


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("cluster")
async def test_release_reads_and_takes_over_head_logs(
    release: Release, uri: str, client: BookKeeper
) -> None:
    """A log created by this tree with its defaults, and a raw one: the release's reader reads
    both, the release's writer takes them over, and this tree reads the result."""
    fresh = records("f", 4, keyed=True) + records("g", 3)
    raw = records("r", 5)
    written = await run_steps(client, [
        {"op": "log_write", "log": "fresh", "records": fresh},
        {"op": "log_write", "log": "raw", "records": raw, "options": {"record_format": "raw"}},
        {"op": "log_read", "log": "fresh"},
        {"op": "log_read", "log": "raw"},
    ])  # fmt: skip
    read = await release.run(uri, [
        {"op": "log_read", "log": "fresh"},
        {"op": "log_read", "log": "raw"},
        {"op": "log_write", "log": "fresh", "records": records("h", 3, keyed=True)},
        {"op": "log_write", "log": "raw", "records": records("s", 3)},
    ])  # fmt: skip
    assert read[0] == written[2]
    assert read[1] == written[3]
    assert contents(read[0]) == as_read(fresh)

    after = await run_steps(client, [
        {"op": "log_read", "log": "fresh"}, {"op": "log_read", "log": "raw"},
    ])  # fmt: skip
    assert contents(after[0]) == as_read(fresh + records("h", 3, keyed=True))
    assert contents(after[1]) == as_read(raw + records("s", 3))


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("cluster")
async def test_release_writer_between_two_head_writers(
    release: Release, uri: str, client: BookKeeper
) -> None:
    """Writers of both versions taking one log in turn (a rolling upgrade's restarts): each
    takeover fences the writer before it, whichever version either is, and the log holds
    exactly the records each writer had acknowledged, in order."""
    first = await client.open_log_writer("mixed")
    for i in range(3):
        await first.append(b"a-%d" % i)
    await release.run(uri, [{"op": "log_write", "log": "mixed", "records": records("b", 2)}])
    second = await client.open_log_writer("mixed")
    for i in range(2):
        await second.append(b"c-%d" % i)

    try:
        await first.append(b"stale")
    except errors.LedgerFencedError:  # LogFencedError is one
        stale = "fenced"
    else:
        stale = "appended"
    await second.append(b"c-2")
    await second.close()
    with contextlib.suppress(errors.BKError):
        await first.close()
    reader = await client.open_log_reader("mixed", LogPosition.EARLIEST, follow=False)
    data = [record.data.decode() async for record in reader]
    expected = ["a-0", "a-1", "a-2", "b-0", "b-1", "c-0", "c-1", "c-2"]
    assert (stale, data) == ("fenced", expected), f"the first writer's append: {stale}; {data}"


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("cluster")
async def test_release_truncation_under_a_head_writer(
    release: Release, uri: str, client: BookKeeper
) -> None:
    """A release's client truncating a log (an operator's tool, a retention job not yet
    upgraded) while this tree's writer writes to it: routine maintenance, which the writer
    goes on through, rolling to new ledgers."""
    writer = await client.open_log_writer("trimmed", roll_bytes=1)  # a ledger per record
    at = [await writer.append(b"t-%d" % i) for i in range(4)]
    assert len({p.ledger_id for p in at}) == 4
    (truncated,) = await release.run(
        uri, [{"op": "log_truncate", "log": "trimmed", "before": [at[2].ledger_id, 0]}]
    )
    assert truncated["deleted"] == [at[0].ledger_id, at[1].ledger_id]
    for i in range(4, 7):
        await writer.append(b"t-%d" % i)
    await writer.close()
    reader = await client.open_log_reader("trimmed", LogPosition.EARLIEST, follow=False)
    data = [record.data.decode() async for record in reader]
    assert data == [f"t-{i}" for i in range(2, 7)]


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("cluster")
async def test_a_release_writer_or_truncation_keeps_what_the_log_knows_of_its_producers(
    release: Release, uri: str, client: BookKeeper
) -> None:
    """A release writes the log record back with the fields it does not know, so a producer's
    next writer of this tree still learns its last sequence after a release's writer and a
    release's truncation took their turns, and re-sent sequences are not appended again."""
    producer = await client.open_log_writer("produced", producer_id="svc", roll_bytes=1)
    at = [await producer.append(b"p-%d" % i) for i in range(5)]
    await producer.close()
    await release.run(uri, [{"op": "log_write", "log": "produced", "records": records("r", 2)}])
    (truncated,) = await release.run(
        uri, [{"op": "log_truncate", "log": "produced", "before": [at[1].ledger_id, 0]}]
    )
    assert truncated["deleted"] == [at[0].ledger_id]
    resumed = await client.open_log_writer("produced", producer_id="svc")
    assert resumed.last_sequence == 4
    assert [await resumed.append(b"p-%d" % i, sequence=i) for i in (3, 4)] == [None, None]
    await resumed.append(b"p-5", sequence=5)
    await resumed.close()
    reader = await client.open_log_reader("produced", LogPosition.EARLIEST, follow=False)
    read = [(record.data.decode(), record.sequence) async for record in reader]
    expected = [*((f"p-{i}", i) for i in range(1, 5)), ("r-0", None), ("r-1", None), ("p-5", 5)]
    assert read == expected
