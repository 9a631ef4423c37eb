"""Why a bookie's disk is not reclaimed (``bookie.gc_report``): the pure verdicts, the per-ledger
byte tallies of the entry logs, then a real bookie through ``aiobk bookie gc`` and the HTTP
admin API -- before a pass, after it, and while its compaction runs."""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aiobk.bookie.disk import OsDisk
from aiobk.bookie.entrylog.format import RECORD_HEAD
from aiobk.bookie.entrylog.logger import EntryLogger
from aiobk.bookie.gc_report import (
    ACTIVE,
    COMPACTABLE,
    KEPT,
    NO_COMPACTION,
    QUEUED,
    REMOVABLE,
    REPORT_LOGS,
    STUCK,
    UNMEASURED,
    LedgerFacts,
    LogFacts,
    classify,
    report_document,
)
from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess
from aiobk.protocol import DEFAULT_MAX_FRAME_SIZE, GcReportResponse, StatusCode, encode
from aiobk.runner import start_http_admin
from tests.bookie.test_gc import SMALL_LOGS, _aiobk, _check, _interleaved, _one_bookie
from tests.support.cluster import start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(60)

HELD = LedgerFacts(held=True)


def _by_id(reports: list[Any]) -> dict[int, Any]:
    return {r.log_id: r for r in reports}


def test_each_log_gets_its_verdict_and_what_it_frees() -> None:
    logs = [
        LogFacts(1, 1000, records=10, entries={5: 10}, ledger_bytes={5: 990}),  # all live
        LogFacts(2, 1000, records=10, entries={6: 10}, ledger_bytes={6: 990}),  # 6 dropped
        LogFacts(3, 1000, records=10, entries={5: 1, 6: 9}, ledger_bytes={5: 99, 6: 891}),
        LogFacts(4, 1000, records=10, entries={5: 4, 6: 6}, ledger_bytes={5: 396, 6: 594}),
        LogFacts(5, 1000, records=None, entries={5: 3, 6: 7}),  # never counted
        LogFacts(7, 300, ACTIVE, records=3, entries={5: 3}, ledger_bytes={5: 297}),
    ]
    ledgers = {5: LedgerFacts(held=True, metadata="open"), 6: LedgerFacts(held=False)}
    reports = _by_id(classify(logs, ledgers, threshold=0.5, per_pass=1))
    assert reports[1].state == KEPT
    assert reports[1].reason == "100% of its records live, gc_compaction_threshold 50%: kept " \
        "until more of it is deleted"  # fmt: skip
    assert reports[1].kept_by == ((5, 990, "still open (its writer may add to it)"),)
    assert (reports[2].state, reports[2].reclaimable_bytes) == (REMOVABLE, 1000)
    assert (reports[3].state, reports[3].live_bytes, reports[3].reclaimable_bytes) == (
        COMPACTABLE, 99, 901,
    )  # fmt: skip
    assert reports[3].reason.endswith("compacted by the next pass")
    assert reports[4].state == QUEUED  # 40% live: under the threshold, behind log 3
    assert reports[5].state == UNMEASURED
    assert reports[5].live_bytes_estimated
    assert reports[7].state == ACTIVE
    assert reports[7].reclaimable_bytes == 0
    document = report_document(list(reports.values()), threshold=0.5, progress=None, last_pass=None)
    assert document["reclaimable_bytes"] == 1000 + 901 + (1000 - 396)
    assert document["logs"][2]["file"] == "00000003.log"
    assert document["logs"][2]["live_share"] == 0.1
    json.dumps(document)


def test_compaction_off_stuck_logs_and_deleted_ledgers_are_said() -> None:
    logs = [
        LogFacts(1, 1000, records=10, entries={5: 1, 6: 9}),  # bytes unknown: estimated
        LogFacts(2, 1000, records=10, entries={5: 1, 7: 9}, ledger_bytes={5: 100, 7: 900}),
    ]
    off = _by_id(classify(logs, {6: LedgerFacts(False)}, threshold=0.0, per_pass=8))
    assert off[1].state == NO_COMPACTION
    assert "gc_compaction_threshold = 0" in off[1].reason
    assert (off[1].live_bytes, off[1].live_bytes_estimated) == (100, True)
    stuck = _by_id(
        classify(logs, {6: LedgerFacts(False)}, threshold=0.5, per_pass=8, stuck=frozenset({1}))
    )
    assert stuck[1].state == STUCK
    assert stuck[1].kept_by == ((5, 100, "live"),)
    # Ledger 7 is deleted in the metadata but still held here: the next pass drops it first.
    dropped = _by_id(
        classify(logs, {7: LedgerFacts(True, metadata="deleted")}, threshold=0.5, per_pass=8)
    )
    assert dropped[2].state == COMPACTABLE
    assert dropped[2].reason.endswith(", once it drops deleted ledger(s) 7")
    limbo = _by_id(classify(logs, {5: LedgerFacts(True, limbo=True)}, threshold=0.05, per_pass=8))
    assert limbo[2].kept_by[1] == (5, 100, "in limbo (waits for the boot repair)")


def test_a_report_of_many_logs_details_those_with_most_to_reclaim_and_fits_a_frame() -> None:
    big = 1 << 62  # the largest figures, the longest JSON
    logs = [
        LogFacts(
            n, big, records=1000, entries={big + k: 999 for k in range(5)},
            ledger_bytes={big + k: big // 8 for k in range(5)},
        )
        for n in range(3 * REPORT_LOGS)
    ]  # fmt: skip
    logs[7] = LogFacts(7, 1000, records=10, entries={5: 10})  # all dead: removable
    ledgers = {5: LedgerFacts(held=False)}
    ledgers.update({big + k: LedgerFacts(held=True, metadata="closed") for k in range(5)})
    reports = classify(logs, ledgers, threshold=0.5, per_pass=8)
    document = report_document(reports, threshold=0.5, progress=None, last_pass=None)
    assert document["logs_total"] == len(logs)
    assert len(document["logs"]) == REPORT_LOGS
    assert document["logs"][7]["state"] == REMOVABLE  # reclaimable: shown first
    assert document["total_bytes"] == sum(r.total_bytes for r in reports)  # counts them all
    assert len(document["logs"][0]["kept_by"]) == 3
    size = len(encode(GcReportResponse(1 << 62, StatusCode.EOK, json.dumps(document))))
    assert size < DEFAULT_MAX_FRAME_SIZE, size
    few = report_document(reports[:3], threshold=0.5, progress=None, last_pass=None)
    assert (few["logs_total"], len(few["logs"])) == (3, 3)


async def test_entry_logs_tally_each_ledgers_bytes_and_keep_them(tmp_path: Path) -> None:
    directory = str(tmp_path / "entries")
    logger = EntryLogger(OsDisk(), directory, max_log_size=4096, write_buffer_size=1024)
    await logger.open()
    expected: dict[int, dict[int, int]] = {}
    records: dict[int, int] = {}
    entry_id = 0
    for step in range(60):  # single appends and batches of four, which roll mid-batch
        ledger = 1 + step % 3
        batch = [(entry_id + n, b"x" * (100 + step)) for n in range(4 if step % 2 else 1)]
        entry_id += len(batch)
        if len(batch) == 1:
            locations = [logger.append(ledger, *batch[0])]
        else:
            locations = logger.append_many(ledger, batch)
        for location, (_entry, body) in zip(locations, batch, strict=True):
            records[location >> 40] = records.get(location >> 40, 0) + 1
            per_log = expected.setdefault(location >> 40, {})
            per_log[ledger] = per_log.get(ledger, 0) + RECORD_HEAD.size + len(body)
    await logger.sync()
    active = logger.active_log
    assert await logger.ledger_bytes(active) == expected[active]
    complete = sorted(set(expected) - {active})
    assert len(complete) >= 2
    for log_id in complete:
        assert await logger.ledger_bytes(log_id) == expected[log_id]
        assert os.path.exists(os.path.join(directory, f"{log_id:08x}.lmap"))
    await logger.close()
    # A new life: the saved maps read back; one lost with its file is unknown, then scanned.
    os.remove(os.path.join(directory, f"{complete[0]:08x}.lmap"))
    again = EntryLogger(OsDisk(), directory, max_log_size=4096, write_buffer_size=1024)
    await again.open()
    assert await again.ledger_bytes(complete[1]) == expected[complete[1]]
    assert await again.ledger_bytes(complete[0]) is None
    assert await again.ledger_bytes(complete[0], scan=True) == expected[complete[0]]
    assert await again.ledger_bytes(active, scan=True) == expected[active]  # complete now
    assert await again.known_record_count(active) == records[active]  # counted by the scan
    data = (tmp_path / "entries" / f"{active:08x}.lmap").read_bytes()
    assert len(data) == struct.calcsize(">QQ") * len(expected[active])
    await again.close()


async def test_a_report_writes_nothing_and_no_side_file_outlives_its_log(tmp_path: Path) -> None:
    directory = str(tmp_path / "entries")
    logger = EntryLogger(OsDisk(), directory, max_log_size=4096, write_buffer_size=1024)
    await logger.open()
    for entry_id in range(100):
        logger.append(1 + entry_id % 2, entry_id, b"y" * 200)
    await logger.sync()
    first, second = (await logger.log_ids())[:2]

    def side_files() -> list[str]:
        return sorted(n for n in os.listdir(directory) if n.endswith((".cnt", ".lmap")))

    # What a report reads (also on a full disk, while a pass runs): known, nothing written.
    assert (await logger.known_ledger_bytes(second) or {}).keys() == {1, 2}
    assert side_files() == []
    assert await logger.record_count(first) > 0
    assert await logger.ledger_bytes(first) is not None  # a pass's: saved beside the log
    assert side_files() == [f"{first:08x}.cnt", f"{first:08x}.lmap"]
    assert await logger.remove_log(first) > 0
    assert side_files() == []
    await logger.close()
    # Left by a crash between removing a log and its side files: gone at the next start,
    # so a log that takes the same number later reads no stale count or map.
    last = max(int(n[:8], 16) for n in os.listdir(directory) if n.endswith(".log"))
    for name in (f"{last + 1:08x}.cnt", f"{last + 1:08x}.lmap"):
        (tmp_path / "entries" / name).write_bytes(b"7")
    again = EntryLogger(OsDisk(), directory, max_log_size=4096, write_buffer_size=1024)
    await again.open()
    assert again.active_log == last + 1
    assert side_files() == []
    assert await again.known_record_count(last + 1) == 0
    await again.close()


COMPACTING = {**SMALL_LOGS, "gc_compaction_threshold": 0.5}


async def test_the_cli_reports_what_a_pass_would_free_runs_it_and_reports_again(
    tmp_path: Path,
) -> None:
    async with _one_bookie(tmp_path, **COMPACTING) as (cluster, bk):
        keep, doomed = await _interleaved(bk)  # every log: 1 entry in 5 of keep's
        address = str(cluster.bookies[0].address)
        code, out, err = await _aiobk("bookie", "gc", address, "--report", "--json")
        assert code == 0, err
        before = json.loads(out)["report"]
        states = [log["state"] for log in before["logs"]]
        assert states[-1] == "active"
        assert set(states[:-1]) == {"kept"}, before["logs"]
        assert before["reclaimable_bytes"] == 0
        first = before["logs"][0]
        assert first["live_share"] == 1.0
        assert first["live_bytes"] <= first["total_bytes"]
        assert {k["ledger_id"] for k in first["kept_by"]} == {keep.ledger_id, doomed.ledger_id}
        assert {k["ledger"] for k in first["kept_by"]} == {"closed and live"}

        await bk.delete_ledger(doomed.ledger_id)
        code, out, err = await _aiobk("bookie", "gc", address, "--report", "--json")
        deleted = json.loads(out)["report"]
        complete = deleted["logs"][:-1]
        assert {log["state"] for log in complete} <= {"compactable", "queued"}, complete
        assert sum(log["state"] == "compactable" for log in complete) == min(8, len(complete))
        assert all(
            log["reason"].endswith(f"once it drops deleted ledger(s) {doomed.ledger_id}")
            for log in complete
        )
        assert all(0.1 <= log["live_share"] <= 0.3 for log in complete)  # one in five
        assert deleted["reclaimable_bytes"] == sum(
            log["total_bytes"] - log["live_bytes"] for log in complete
        )
        assert deleted["running"] is None

        code, out, err = await _aiobk("bookie", "gc", address, "--report")
        assert code == 0, err
        assert out.startswith("entry logs: ")
        assert "reclaimable by the next passes" in out.splitlines()[0]
        assert "compactable" in out
        assert "the log taking appends" in out

        code, out, err = await _aiobk("bookie", "gc", address, "--json")
        assert code == 0, err
        figures = json.loads(out)
        assert figures["ledgers_deleted"] == 1
        after = figures["report"]
        assert after["last_pass"]["ledgers_deleted"] == 1
        assert after["last_pass"]["logs_compacted"] == figures["logs_removed"] > 0
        assert after["reclaimable_bytes"] < deleted["reclaimable_bytes"]
        while after["reclaimable_bytes"]:  # what one pass left (8 logs a pass) the next takes
            code, out, err = await _aiobk("bookie", "gc", address, "--json")
            assert code == 0, err
            after = json.loads(out)["report"]
        assert {log["state"] for log in after["logs"]} <= {"kept", "active"}
        await _check(keep.ledger_id, bk, 30, b"k")


async def test_http_gc_details_shows_compaction_progress_while_it_runs(
    tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    cluster = await start_cluster(tmp_path, 0, uri=etcd_server.uri(unique_name("gcreport")))
    bookie = await cluster.add_bookie(http_port=0, autorecovery_enabled=False, **COMPACTING)
    http = await start_http_admin(bookie, gc_wait=0.1)
    assert http is not None
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
    logger = bookie.storage.entry_logger
    walk = logger.records
    reached, release = asyncio.Event(), asyncio.Event()

    async def paused(log_id: int) -> AsyncIterator[tuple[int, int, int, bytes]]:
        """The compaction's walk of a log, held after its first record until released."""
        async for record in walk(log_id):
            yield record
            if not release.is_set():
                reached.set()
                await release.wait()

    try:
        async with BookKeeper(cluster.uri) as bk:
            keep, doomed = await _interleaved(bk)
            await bk.delete_ledger(doomed.ledger_id)
            logger.records = paused  # type: ignore[method-assign]
            async with session.put(f"{http.url}/api/v1/bookie/gc") as response:
                assert response.status == 202
            await asyncio.wait_for(reached.wait(), 20)
            async with session.get(f"{http.url}/api/v1/bookie/gc_details") as response:
                assert response.status == 200
                details = await response.json()
            running = details["report"]["running"]
            assert running["phase"] == "compacting"
            assert running["ledgers_deleted"] == 1
            assert running["logs_to_compact"] == 8
            assert running["logs_compacted"] == 0
            assert running["compacting_log"] == details["report"]["logs"][0]["log_id"]
            assert 0 < running["compacting_bytes_scanned"] < running["compacting_log_bytes"]
            release.set()

            documents: list[dict[str, Any]] = []

            async def ended() -> bool:
                async with session.get(f"{http.url}/api/v1/bookie/gc_details") as response:
                    documents.append(await response.json())
                return documents[-1]["report"]["running"] is None

            await wait_until(ended, timeout=20, what="the GC pass ended")
            done = documents[-1]
            assert done["report"]["last_pass"]["logs_compacted"] == 8
            assert done["last_requested_pass"]["logs_compacted"] == 8
            await _check(keep.ledger_id, bk, 30, b"k")
    finally:
        release.set()
        await session.close()
        await http.stop()
        await cluster.stop()
