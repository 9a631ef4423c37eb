"""aiobk bookies list / ledger list / ledger show against a real etcd."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiobk.bookie import Bookie, BookieConfig
from aiobk.metadata import Fragment, LedgerMetadata, open_store
from tests.support.cli import aiobk_sync
from tests.support.names import unique_name


async def test_cli_lists_bookies_and_ledgers(etcd_server, tmp_path: Path) -> None:
    uri = etcd_server.uri(unique_name("cli"))
    bookie = Bookie(BookieConfig(data_dir=str(tmp_path / "b"), port=0, metadata_uri=uri))
    await bookie.start()
    store = open_store(uri)
    try:
        ledger_id = await store.allocate_ledger_id()
        ensemble = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
        await store.create_ledger(ledger_id, LedgerMetadata(3, 2, 2, (Fragment(0, ensemble),)))

        listed = await asyncio.to_thread(aiobk_sync, "bookies", "list", "--metadata", uri, "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert row["id"] == bookie.bookie_id
        assert row["state"] == "writable"
        human = await asyncio.to_thread(aiobk_sync, "bookies", "list", "--metadata", uri)
        assert bookie.bookie_id in human.stdout

        ids = await asyncio.to_thread(aiobk_sync, "ledger", "list", "--metadata", uri, "--json")
        assert json.loads(ids.stdout) == [ledger_id]
        shown = await asyncio.to_thread(
            aiobk_sync, "ledger", "show", str(ledger_id), "--metadata", uri, "--json"
        )
        document = json.loads(shown.stdout)
        assert document["ledger_id"] == ledger_id
        assert document["fragments"][0]["ensemble"] == list(ensemble)
        table = await asyncio.to_thread(
            aiobk_sync, "ledger", "show", str(ledger_id), "--metadata", uri
        )
        assert "127.0.0.1:2" in table.stdout
        assert "OPEN" in table.stdout

        missing = await asyncio.to_thread(aiobk_sync, "ledger", "show", "999999", "--metadata", uri)
        assert missing.returncode != 0
        assert missing.stderr.strip() == "aiobk: error: ledger 999999 does not exist"
    finally:
        await store.close()
        await bookie.stop()


def test_cli_metadata_errors_are_one_line() -> None:
    for args, message in [
        (["bookies", "list"], "--metadata (or AIOBK_METADATA) is required"),
        (["bookies", "list", "--metadata", "zk://x"], "unsupported metadata URI"),
        (["ledger", "show", "abc", "--metadata", "memory://x"], "LEDGER_ID"),
        (["bookies", "list", "--metadata", "etcd://127.0.0.1:1/x"], "etcd"),
    ]:
        result = aiobk_sync(*args)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert message in lines[0]
