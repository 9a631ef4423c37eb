"""A full disk must not brick a bookie.

Before the fix, with its data directory on a 64 MiB filesystem a bookie never turned read-only,
kept acknowledging adds while holding unwritable entry logs in memory, freed nothing on GC
("checkpoint failed: ENOSPC") even with every ledger deleted, exited 1 on SIGTERM and could not
restart; with its journal directory full it answered EIO to every add while staying registered
writable, so new ledgers kept being placed on it.

Each test runs one bookie process on a small filesystem (``tests.hostile.small_disk``: a real
tmpfs as root, otherwise a simulated disk, and the test logs which) beside three ordinary
bookies, against the session's etcd, with a real client writing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookieConnection, BookKeeper, LedgerHandle
from aiobk.metadata import READ_ONLY, WRITABLE, EtcdProcess, open_store
from aiobk.protocol import (
    BookieStateRequest,
    BookieStateResponse,
    ReadRequest,
    ReadResponse,
    StatusCode,
)
from tests.hostile.harness import BookieUnderTest, MiB
from tests.hostile.small_disk import SmallDisk, small_disk
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.wait import wait_until

log = logging.getLogger(__name__)

ENTRY = b"e" * (128 * 1024)
SETTINGS: dict[str, Any] = {
    # Lower than the defaults so that a junk file leaving the reserve's room decides the
    # state (on a 64 MiB disk the journal alone moves usage by several percent).
    "disk_usage_threshold": 0.90,
    "disk_usage_warn_threshold": 0.85,
    "disk_usage_lwm_threshold": 0.80,
    "disk_check_interval": 0.5,
    "flush_interval": 1.0,
    "gc_interval": 0.0,  # passes are run by hand here (a forced one still runs when warned)
    "entry_log_write_buffer": 1 * MiB,
    "journal_max_file_size": 8 * MiB,
    "disk_reserved_space": 4 * MiB,
    "min_usable_size_for_high_priority_writes": 1 * MiB,
}


async def _registry_state(uri: str, bookie_id: str, want: str, timeout: float = 20.0) -> None:
    store = open_store(uri)
    seen: list[str | None] = [None]

    async def registered() -> bool:
        seen[0] = {b.bookie_id: b.state for b in await store.list_bookies()}.get(bookie_id)
        return seen[0] == want

    try:
        await wait_until(registered, every=0.1, timeout=timeout, what=f"{bookie_id} {want}")
    except AssertionError:
        raise AssertionError(f"{bookie_id} is registered {seen[0]!r}, not {want!r}") from None
    finally:
        await store.close()


async def _bookie_state(port: int, writable: bool, timeout: float = 20.0) -> None:
    """Wait until the bookie itself says it is (not) writable."""
    conn = await BookieConnection.open("127.0.0.1", port)
    answers: list[object] = [None]

    async def says() -> bool:
        answer = answers[0] = await conn.send(BookieStateRequest(conn.next_txn_id()), 10)
        assert isinstance(answer, BookieStateResponse)
        return bool(answer.writable) == writable

    try:
        await wait_until(says, every=0.1, timeout=timeout, what=f"writable={writable}")
    except AssertionError:
        raise AssertionError(f"bookie {port} still says {answers[0]}") from None
    finally:
        conn.close()


async def _fill_until_read_only(small: SmallDisk, port: int, leave: int) -> None:
    """Fill the disk but for ``leave`` bytes, and again while the bookie frees space of its
    own (a checkpoint releases journal files) and turns writable, until it settles read-only
    for two checks."""
    for _ in range(20):
        small.fill(leave=leave)
        await _bookie_state(port, writable=False)
        await asyncio.sleep(2 * SETTINGS["disk_check_interval"])
        conn = await BookieConnection.open("127.0.0.1", port)
        answer = await conn.send(BookieStateRequest(conn.next_txn_id()), 10)
        conn.close()
        assert isinstance(answer, BookieStateResponse)
        if not answer.writable:
            return
    raise AssertionError("the bookie did not settle read-only on a full disk")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiobk", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _state(address: str) -> dict[str, Any]:
    run = _cli("bookie", "state", address, "--json")
    assert run.returncode == 0, run.stderr
    document: dict[str, Any] = json.loads(run.stdout)
    return document


async def _ledger_on(bk: BookKeeper, bookie_id: str) -> LedgerHandle:
    """A ledger whose ensemble holds ``bookie_id`` (placement is random: bounded tries)."""
    for _ in range(50):
        handle = await bk.create_ledger(3, 3, 2, password=b"full")
        if bookie_id in handle.metadata.ensemble:
            return handle
        await handle.close()
    raise AssertionError(f"no ledger placed on {bookie_id} in 50 tries")


async def _start(
    tmp_path: Path,
    small: SmallDisk,
    uri: str,
    name: str,
    *others: SmallDisk,
    **settings: Any,
) -> BookieUnderTest:
    log.warning("disk-full test on %s", small.how)
    bookie = BookieUnderTest(
        tmp_path, {**SETTINGS, **settings}, name=name, args=("--metadata", uri)
    )
    bookie.proc.env.update(small.env(*others))
    await bookie.start()
    return bookie


async def _cluster(tmp_path: Path, uri: str) -> Cluster:
    return await start_cluster(tmp_path / "others", 3, uri=uri, gc_interval=0.0)


@pytest.mark.timeout(240)
async def test_a_full_data_disk_turns_read_only_frees_on_gc_and_restarts(
    tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    uri = etcd_server.uri(unique_name("diskfull"))
    with small_disk(tmp_path / "x", 64 * MiB) as small:
        x = await _start(tmp_path, small, uri, "x")
        others = await _cluster(tmp_path, uri)
        bk = await BookKeeper.connect(uri)
        try:
            x_id = f"127.0.0.1:{x.port}"
            handle = await _ledger_on(bk, x_id)
            written = 0
            with x.sampler() as rss:
                # Fill: 128 KiB entries until the ensemble has moved off the full bookie. Not
                # one append may fail; the bookie must stop taking adds, not hold them.
                for _ in range(120):  # bounded: 120 x 8 x 128 KiB = 120 MiB, twice the disk
                    await asyncio.gather(*(handle.append(ENTRY) for _ in range(8)))
                    written += 8
                    if x_id not in handle.metadata.ensemble:
                        break
            assert x_id not in handle.metadata.ensemble, "the ensemble never left the full disk"
            figures = await x.stats()
            assert figures["disk_full_errors"] + figures["adds_refused_read_only"] > 0, figures
            # It did not keep what it could not write (before: RSS grew with every add).
            assert rss.growth < 96 * MiB, rss.growth
            # Something else takes the rest but for the reserve's room: read-only, and it
            # stays so while the disk is that full.
            await _fill_until_read_only(small, x.port, leave=4 * MiB)
            await _registry_state(uri, x_id, READ_ONLY)
            state = _state(f"127.0.0.1:{x.port}")
            assert state["state"] == "readonly"
            assert any(reason.startswith("disk:") for reason in state["reasons"]), state
            listed = _cli("bookies", "list", "--metadata", uri, "--json")
            assert {b["id"]: b["state"] for b in json.loads(listed.stdout)}[x_id] == "readonly"
            # Reads are still served: entry 0 straight from the full bookie.
            conn = await BookieConnection.open("127.0.0.1", x.port)
            answer = await conn.send(ReadRequest(conn.next_txn_id(), handle.ledger_id, 0), 10)
            conn.close()
            assert isinstance(answer, ReadResponse)
            assert answer.status is StatusCode.EOK
            await handle.close()  # every append acknowledged is in the closed ledger
            reader = await bk.open_ledger(handle.ledger_id, password=b"full")
            assert reader.last_add_confirmed == written - 1
            # Delete everything: garbage collection on the full disk frees it (its checkpoint
            # writes into the room the reserve gave back). The pass over the warning threshold
            # is forced by the bookie itself; one by hand must work too.
            await bk.delete_ledger(handle.ledger_id, b"full")
            gc = _cli("bookie", "gc", f"127.0.0.1:{x.port}", "--json")
            assert gc.returncode == 0, (gc.stderr, x.log_text()[-6000:])
            assert (await x.stats())["gc_bytes_freed"] > 16 * MiB
            (small.path / "junk").unlink()
            await _bookie_state(x.port, writable=True)
            await _registry_state(uri, x_id, WRITABLE)
            assert (small.path / "DISK_RESERVE").exists()  # set aside again
            # A clean stop on a full disk exits 0; a restart on it starts, read-only.
            small.fill(leave=0)
            await _bookie_state(x.port, writable=False)
            assert x.terminate() == 0, x.log_text()[-3000:]
            await x.start()
            assert _state(f"127.0.0.1:{x.port}")["state"] == "readonly"  # from its first answer
            await _registry_state(uri, x_id, READ_ONLY)
            (small.path / "junk").unlink()
            await _bookie_state(x.port, writable=True)
            await _registry_state(uri, x_id, WRITABLE)
            assert x.terminate() == 0
        finally:
            await bk.close()
            await others.stop()
            x.stop()


@pytest.mark.timeout(240)
async def test_a_full_journal_disk_turns_read_only_at_once_and_heals(
    tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    """Before: EIO to every add while registered writable; new ledgers kept landing on it."""
    uri = etcd_server.uri(unique_name("journalfull"))
    # Its data directory on a small disk of its own too: how full the host's disk is (other
    # tenants of this machine) must not decide the test.
    with (
        small_disk(tmp_path / "yj", 32 * MiB) as small,
        small_disk(tmp_path / "y", 64 * MiB) as data,
    ):
        x = await _start(
            tmp_path, small, uri, "y", data, journal_dir=str(small.path), disk_check_interval=2.0
        )
        others = await _cluster(tmp_path, uri)
        bk = await BookKeeper.connect(uri)
        try:
            x_id = f"127.0.0.1:{x.port}"
            handle = await _ledger_on(bk, x_id)
            await handle.append(b"before")
            small.fill(leave=256 * 1024)
            for _ in range(64):  # bounded: the journal meets the full disk within a few MiB
                await asyncio.gather(*(handle.append(ENTRY) for _ in range(4)))
                if x_id not in handle.metadata.ensemble:
                    break
            assert x_id not in handle.metadata.ensemble
            await _bookie_state(x.port, writable=False)
            await _registry_state(uri, x_id, READ_ONLY)
            reasons = _state(f"127.0.0.1:{x.port}")["reasons"]
            assert any(r.startswith("journal:") for r in reasons), reasons
            # New ledgers are placed elsewhere while it is read-only.
            for _ in range(10):
                other = await bk.create_ledger(3, 3, 2, password=b"full")
                assert x_id not in other.metadata.ensemble
                await other.close()
            # Space back: the journal writes what it stalled, the bookie is writable again,
            # and takes adds; a restart replays its journal (dense LSNs, nothing refused).
            (small.path / "junk").unlink()
            await _bookie_state(x.port, writable=True)
            await _registry_state(uri, x_id, WRITABLE)
            again = await _ledger_on(bk, x_id)
            for _ in range(20):
                await again.append(b"after")
            await again.close()
            assert x.terminate() == 0
            await x.start()
            await _registry_state(uri, x_id, WRITABLE)
            reader = await bk.open_ledger(again.ledger_id, password=b"full", recovery=False)
            assert [e.data for e in await reader.read(0, 19)] == [b"after"] * 20
            await handle.close()
        finally:
            await bk.close()
            await others.stop()
            x.stop()
