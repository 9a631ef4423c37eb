"""aiobk simpletest / ledger read|recover|delete against real bookies and etcd."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from client import BookKeeper
from tests.cluster import start_cluster
from tests.conftest import unique_name


def _aiobk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from aiobk.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_client_commands(etcd_server, tmp_path: Path) -> None:
    uri = etcd_server.uri(unique_name("clicmd"))
    cluster = await start_cluster(tmp_path, 3, uri=uri)
    try:
        result = await asyncio.to_thread(
            _aiobk, "simpletest", "--metadata", uri, "--entries", "200", "--entry-size", "64"
        )
        assert result.returncode == 0, result.stderr
        assert "wrote 200 entries" in result.stdout
        assert "all verified" in result.stdout

        async with await BookKeeper.connect(uri) as bk:
            lh = await bk.create_ledger(3, 3, 2, password=b"pw")
            for i in range(5):
                await lh.append(b"line %d" % i)  # left open: the writer "died"
        read = await asyncio.to_thread(
            _aiobk, "ledger", "read", str(lh.ledger_id), "--metadata", uri, "--password", "pw"
        )
        assert read.returncode == 0, read.stderr
        assert read.stdout.splitlines() == [f"{i}\tline {i}" for i in range(5)]
        some = await asyncio.to_thread(
            _aiobk, "ledger", "read", str(lh.ledger_id), "--metadata", uri,
            "--password", "pw", "--from", "1", "--to", "2", "--json",
        )  # fmt: skip
        assert [json.loads(x)["entry_id"] for x in some.stdout.splitlines()] == [1, 2]
        recovered = await asyncio.to_thread(
            _aiobk, "ledger", "recover", str(lh.ledger_id), "--metadata", uri, "--password", "pw"
        )
        document = json.loads(recovered.stdout)
        assert document["state"] == "CLOSED"
        assert document["last_entry_id"] == 4
        wrong = await asyncio.to_thread(
            _aiobk, "ledger", "read", str(lh.ledger_id), "--metadata", uri, "--password", "no"
        )
        assert wrong.returncode != 0
        assert wrong.stderr.strip() == f"aiobk: error: wrong password for ledger {lh.ledger_id}"
        deleted = await asyncio.to_thread(
            _aiobk, "ledger", "delete", str(lh.ledger_id), "--metadata", uri
        )
        assert deleted.returncode == 0
        gone = await asyncio.to_thread(
            _aiobk, "ledger", "show", str(lh.ledger_id), "--metadata", uri
        )
        assert "does not exist" in gone.stderr
    finally:
        await cluster.stop()
