"""aiobk simpletest / ledger read|recover|delete against real bookies and etcd."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pty
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from client import BookKeeper, ClientConfig
from metadata import EtcdProcess
from tests.cluster import Cluster, start_cluster
from tests.conftest import unique_name


def _aiobk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from aiobk.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _aiobk_on_terminal(*args: str, answer: bytes = b"") -> tuple[int, str, str]:
    """Run aiobk with stdin and stderr on a pseudo-terminal, typing ``answer``; returns the
    status, stdout and what the terminal showed."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from aiobk.cli import main; main()", *args],
            stdin=slave, stdout=out, stderr=slave, env=env,
        )  # fmt: skip
        os.close(slave)
        os.write(master, answer)
        shown = bytearray()
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has gone
                break
            if not chunk:
                break
            shown += chunk
        os.close(master)
        status = proc.wait(timeout=120)
        out.seek(0)
        return status, out.read().decode(), shown.decode(errors="replace")


async def aiobk(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_aiobk, *args)


async def bookies_know_lac(bk: BookKeeper, ledger_id: int, password: bytes, lac: int) -> None:
    """Wait until the bookies report ``lac`` (the writer sends its last one explicitly)."""
    rh = await bk.open_ledger(ledger_id, password, recovery=False)
    async with asyncio.timeout(10):
        while await rh.read_last_add_confirmed() < lac:
            await asyncio.sleep(0.02)


@pytest.fixture
async def etcd_cluster(etcd_server: EtcdProcess, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Three in-process bookies registered in the session's etcd, which the CLI reaches."""
    cluster = await start_cluster(tmp_path, 3, uri=etcd_server.uri(unique_name("cli")))
    try:
        yield cluster
    finally:
        await cluster.stop()


async def test_ledger_read_leaves_a_live_writer_writing(etcd_cluster: Cluster) -> None:
    """Issue 13, defect 1: ``ledger read`` fenced the ledger it read, so its writer's next
    append failed with LedgerFencedError. It reads up to the LAC the bookies report instead."""
    uri = etcd_cluster.uri
    async with await BookKeeper.connect(uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            await lh.append(b"line %d" % i)
        await bookies_know_lac(bk, lh.ledger_id, b"pw", 4)
        read = await aiobk(
            "ledger", "read", str(lh.ledger_id), "--metadata", uri, "--password", "pw"
        )
        assert read.returncode == 0, read.stderr
        assert read.stdout.splitlines() == [f"{i}\tline {i}" for i in range(5)]
        assert await lh.append(b"line 5") == 5  # fenced before: LedgerFencedError
        shown = json.loads(
            (await aiobk("ledger", "show", str(lh.ledger_id), "--metadata", uri, "--json")).stdout
        )
        assert shown["state"] == "OPEN"
        await lh.close()


async def test_simpletest(etcd_cluster: Cluster) -> None:
    result = await aiobk(
        "simpletest", "--metadata", etcd_cluster.uri, "--entries", "200", "--entry-size", "64"
    )
    assert result.returncode == 0, result.stderr
    assert "wrote 200 entries" in result.stdout
    assert "all verified" in result.stdout


async def test_ledger_read_recover_and_errors(etcd_cluster: Cluster) -> None:
    uri = etcd_cluster.uri
    config = ClientConfig(explicit_lac_delay=0)  # the bookies learn the LAC only from adds
    async with BookKeeper(uri, config) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            await lh.append(b"line %d" % i)  # left open: the writer "died"
    ledger = str(lh.ledger_id)
    read = await aiobk("ledger", "read", ledger, "--metadata", uri, "--password", "pw")
    assert read.returncode == 0, read.stderr
    # Up to the LAC the bookies report: entry 4's confirmation came with no later add.
    assert read.stdout.splitlines() == [f"{i}\tline {i}" for i in range(4)]
    past = await aiobk("ledger", "read", ledger, "--metadata", uri, "--password", "pw", "--to", "4")
    assert past.returncode == 1
    assert past.stderr == (
        f"aiobk: error: ledger {ledger}: --to 4 is past its last add confirmed (3; the ledger "
        "is open)\n"
    )
    some = await aiobk(
        "ledger", "read", ledger, "--metadata", uri,
        "--password", "pw", "--from", "1", "--to", "2", "--json",
    )  # fmt: skip
    assert [json.loads(x)["entry_id"] for x in some.stdout.splitlines()] == [1, 2]
    assert base64.b64decode(json.loads(some.stdout.splitlines()[0])["data_base64"]) == b"line 1"
    backwards = await aiobk("ledger", "read", ledger, "--metadata", uri, "--from", "5", "--to", "3")
    assert backwards.returncode == 2
    assert backwards.stderr == "aiobk: error: --from 5 is after --to 3\n"
    wrong = await aiobk("ledger", "read", ledger, "--metadata", uri, "--password", "no")
    assert wrong.returncode == 1
    assert wrong.stderr == f"aiobk: error: wrong password for ledger {ledger}\n"
    # --recover fences and closes: every entry a quorum holds, then the ledger's end.
    full = await aiobk("ledger", "read", ledger, "--metadata", uri, "--password", "pw", "--recover")
    assert full.stdout.splitlines() == [f"{i}\tline {i}" for i in range(5)]
    recovered = await aiobk(
        "ledger", "recover", ledger, "--metadata", uri, "--password", "pw", "--json"
    )
    assert recovered.returncode == 0, recovered.stderr
    document = json.loads(recovered.stdout)
    assert document["state"] == "CLOSED"
    assert document["last_entry_id"] == 4
    table = await aiobk("ledger", "recover", ledger, "--metadata", uri, "--password", "pw")
    assert "CLOSED" in table.stdout
    # The old opt-out flag is still accepted (hidden): the default now.
    old = await aiobk(
        "ledger", "read", ledger, "--metadata", uri, "--password", "pw", "--no-recovery"
    )
    assert old.stdout.splitlines() == [f"{i}\tline {i}" for i in range(5)]


async def test_ledger_delete_asks_first(etcd_cluster: Cluster) -> None:
    """Issue 13, defect 6: ``ledger delete`` deleted without asking. It asks on a terminal
    unless --yes, refuses without one, and checks --password against the ledger's."""
    uri = etcd_cluster.uri
    async with BookKeeper(uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        await lh.append(b"keep me")
        await lh.close()
        ledger = str(lh.ledger_id)

        async def exists(ledger_id: str = ledger) -> bool:
            return ledger_id in (await aiobk("ledger", "list", "--metadata", uri)).stdout.split()

        piped = await aiobk("ledger", "delete", ledger, "--metadata", uri)
        assert piped.returncode == 2
        assert piped.stderr == (
            f"aiobk: error: deleting ledger {ledger} needs confirmation and stdin is not a "
            "terminal; pass --yes\n"
        )
        assert await exists()
        status, out, shown = await asyncio.to_thread(
            _aiobk_on_terminal, "ledger", "delete", ledger, "--metadata", uri, answer=b"n\n"
        )
        assert f"Delete ledger {ledger} (CLOSED, entries 0..0, 7 bytes)? [y/N]" in shown
        assert status == 1
        assert f"aiobk: error: ledger {ledger} not deleted" in shown
        assert await exists()
        wrong = await aiobk(
            "ledger", "delete", ledger, "--metadata", uri, "--yes", "--password", "x"
        )
        assert wrong.returncode == 1
        assert wrong.stderr == f"aiobk: error: wrong password for ledger {ledger}\n"
        status, out, shown = await asyncio.to_thread(
            _aiobk_on_terminal, "ledger", "delete", ledger, "--metadata", uri, "--password", "x"
        )
        assert status == 1
        assert "wrong password" in shown
        assert "Delete ledger" not in shown  # refused before asking
        assert await exists()
        status, out, shown = await asyncio.to_thread(
            _aiobk_on_terminal, "ledger", "delete", ledger, "--metadata", uri,
            "--password", "pw", answer=b"y\n",
        )  # fmt: skip
        assert status == 0, shown
        assert out == f"deleted ledger {ledger}\n"
        assert not await exists()

        other = await bk.create_ledger(3, 3, 2)
        await other.close()
        yes = await aiobk(
            "ledger", "delete", str(other.ledger_id), "--metadata", uri, "-y", "--json"
        )
        assert yes.returncode == 0, yes.stderr
        assert json.loads(yes.stdout) == {"ledger_id": other.ledger_id, "deleted": True}
        assert not await exists(str(other.ledger_id))
        gone = await aiobk("ledger", "delete", str(other.ledger_id), "--metadata", uri, "--yes")
        assert gone.returncode == 1
        assert "does not exist" in gone.stderr
