"""Appending whole ledgers to a log as its writer (``aiobk.client.log.append``, the Spark
sink's commit): fences the log's writer, keeps ledger order, refuses what would break it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper
from aiobk.client.errors import LogFencedError
from aiobk.client.log.append import append_ledgers_to_log
from aiobk.pipeline.write import TaskWritten, Written, publish_plan
from tests.support.cluster import Cluster, forget, start_cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    started = await start_cluster(tmp_path)
    yield started
    await started.stop()
    forget(started)


async def _closed_ledgers(bk: BookKeeper, count: int) -> list[int]:
    ids = []
    for i in range(count):
        lh = await bk.create_ledger()
        await lh.append(b"row %d" % i)
        await lh.close()
        ids.append(lh.ledger_id)
    return ids


async def test_ledgers_are_appended_in_one_step_and_the_writer_is_fenced(
    cluster: Cluster,
) -> None:
    async with await BookKeeper.connect(cluster.uri) as bk:
        writer = await bk.open_log_writer("events", record_format="raw")  # as the rows below
        await writer.append(b"from the writer")
        ids = await _closed_ledgers(bk, 3)
        record = await append_ledgers_to_log(bk, "events", ids)
        assert record.ledgers[-3:] == tuple(ids)
        assert record.writer == ids[0]  # the commit took it, named by its first ledger
        assert (await bk.store.read_log("events")).ledgers == record.ledgers
        with pytest.raises(LogFencedError, match="another writer took it over"):
            await writer.append(b"after the take-over")  # its ledger was fenced
        with pytest.raises(LogFencedError):
            await writer.append(b"and again")
        reader = await bk.open_log_reader("events", follow=False)
        assert [r.data async for r in reader][:1] == [b"from the writer"]
        created = await append_ledgers_to_log(bk, "new-log", await _closed_ledgers(bk, 1))
        assert len(created.ledgers) == 1  # a missing log is created


async def test_out_of_order_ledgers_are_refused_and_the_log_is_unchanged(
    cluster: Cluster,
) -> None:
    """Positions compare by ledger id: a log whose ledgers are not ascending would read its
    records out of order (the Spark sink once appended in partition order)."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        first, second, third = await _closed_ledgers(bk, 3)
        await append_ledgers_to_log(bk, "ordered", [second])
        before = await bk.store.read_log("ordered")
        with pytest.raises(ValueError, match="strictly ascending"):
            await append_ledgers_to_log(bk, "ordered", [third, third])
        with pytest.raises(LogFencedError, match="cannot follow"):
            await append_ledgers_to_log(bk, "ordered", [first, third])  # first < the log's last
        with pytest.raises(LogFencedError, match="cannot follow"):
            await append_ledgers_to_log(bk, "ordered", [second])  # already in it
        assert (await bk.store.read_log("ordered")).ledgers == before.ledgers


def test_a_spark_commit_publishes_each_log_in_ascending_ledger_order() -> None:
    """Tasks create their ledgers in any order; partition 0 may hold the highest id. Rows
    routed by a ``log`` column give a ledger per log per task; empty ones publish nothing."""
    messages = [
        Written(0, 30, 5), Written(1, 10, 5), None, Written(2, 20, 0), Written(3, 15, 1),
        TaskWritten(4, [Written(4, 42, 3, "east", "envelope"), Written(4, 41, 0, "west")]),
        TaskWritten(5, [Written(5, 40, 1, "east", "envelope"), Written(5, 12, 2, "west")]),
    ]  # fmt: skip
    assert publish_plan(messages, "default") == {
        "default": ("raw", [10, 15, 30]),
        "east": ("envelope", [40, 42]),
        "west": ("raw", [12]),
    }
    assert list(publish_plan(messages, "default")) == ["default", "east", "west"]  # name order
