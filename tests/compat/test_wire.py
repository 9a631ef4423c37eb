"""Over the wire, both ways: the release's client against this tree's bookies, and this tree's
client against the release's bookies. Each side runs the same script of ledger and log
operations (tests/compat/driver.py) and must see the same results."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from aiobk import BookKeeper
from aiobk.bookie import Bookie
from aiobk.client.offload import offload_ledger
from aiobk.metadata import OffloadStoreSettings
from tests.compat.conftest import CLIENT_CONFIG
from tests.compat.driver import run_steps
from tests.compat.harness import Release
from tests.support.procs import BookieProcess


def payloads(tag: str, count: int) -> list[str]:
    return [f"{tag}-{i}" for i in range(count)]


ENVELOPES = [{"data": f"env-{i}", "key": f"k{i % 3}", "headers": {"h": f"v{i}"}} for i in range(10)]

ROUND_TRIP: list[dict[str, Any]] = [
    # A persistent ledger and a volatile one, each written, forced (volatile) and closed.
    {"op": "create", "as": "p", "ensemble": [3, 3, 2], "password": "pw"},
    {"op": "append", "ledger": "p", "payloads": payloads("p", 20)},
    {"op": "close", "ledger": "p"},
    # AQ = WQ: every bookie has taken an add before the FORCE (a FORCE that reaches a bookie
    # still checking the key of the ledger's first add is answered ENOLEDGER).
    {"op": "create", "as": "v", "ensemble": [3, 3, 3], "durability": "volatile"},
    {"op": "append", "ledger": "v", "payloads": payloads("v", 20)},
    {"op": "force", "ledger": "v"},
    {"op": "close", "ledger": "v"},
    # A ledger left open, read without fencing, then opened with recovery.
    {"op": "create", "as": "o", "ensemble": [3, 3, 2], "password": "pw"},
    {"op": "append", "ledger": "o", "payloads": payloads("o", 10)},
    {"op": "open", "as": "rp", "ledger": "p", "password": "pw", "recovery": False},
    {"op": "read", "handle": "rp"},
    {"op": "open", "as": "rv", "ledger": "v", "recovery": False},
    {"op": "read", "handle": "rv"},
    {"op": "open", "as": "ro", "ledger": "o", "password": "pw", "recovery": False},
    {"op": "read_lac", "handle": "ro"},
    {"op": "open", "as": "rr", "ledger": "o", "password": "pw", "recovery": True},
    {"op": "read", "handle": "rr"},
    {"op": "append", "ledger": "o", "payloads": ["late"], "expect_error": True},
    # Logs: a writer appends, a reader reads; in the client's default format and in envelopes.
    {"op": "log_write", "log": "plain", "records": [{"data": d} for d in payloads("r", 10)]},
    {"op": "log_read", "log": "plain"},
    {"op": "log_write", "log": "keyed", "records": ENVELOPES,
     "options": {"record_format": "envelope"}},
    {"op": "log_read", "log": "keyed"},
]  # fmt: skip


def check_round_trip(results: list[dict[str, Any]]) -> None:
    assert len(results) == len(ROUND_TRIP)
    r = results
    assert r[1]["entry_ids"] == list(range(20))
    assert r[4]["entry_ids"] == list(range(20))
    assert r[5]["lac"] == 19
    assert r[9] == {"ledger_id": r[0]["ledger_id"], "closed": True, "lac": 19}
    assert r[10]["data"] == payloads("p", 20)
    assert r[11]["closed"]
    assert r[12]["data"] == payloads("v", 20)
    assert r[13]["closed"] is False
    assert -1 <= r[14]["lac"] <= 9  # adds sent at once all carry LAC -1
    assert r[15]["closed"]
    assert r[15]["lac"] == 9
    assert r[16]["data"] == payloads("o", 10)
    assert r[17]["error"] == "LedgerFencedError", r[17]
    positions = r[18]["positions"]
    assert [rec["data"] for rec in r[19]["records"]] == payloads("r", 10)
    assert [rec["position"] for rec in r[19]["records"]] == positions
    keyed = r[21]["records"]
    assert [rec["position"] for rec in keyed] == r[20]["positions"]
    assert [{k: rec[k] for k in ("data", "key", "headers")} for rec in keyed] == ENVELOPES


@pytest.mark.timeout(90)
async def test_release_client_against_head_bookies(
    release: Release, uri: str, head_bookies: Callable[..., Awaitable[list[Bookie]]]
) -> None:
    await head_bookies(3)
    check_round_trip(await release.run(uri, ROUND_TRIP, CLIENT_CONFIG))


@pytest.mark.timeout(90)
async def test_head_client_against_release_bookies(
    release_bookies: Callable[..., Awaitable[list[BookieProcess]]], client: BookKeeper, uri: str
) -> None:
    await release_bookies(3)
    check_round_trip(await run_steps(client, ROUND_TRIP))
    # A cluster only the release's bookies ran in has no cluster record: this tree's client
    # accepts it by what the release wrote there, and none of them writes the record.
    async with BookKeeper(uri) as bk:
        assert bk.cluster is None


@pytest.mark.timeout(90)
async def test_head_client_offloads_a_ledger_of_release_bookies(
    release_bookies: Callable[..., Awaitable[list[BookieProcess]]],
    client: BookKeeper,
    uri: str,
    tmp_path: Path,
) -> None:
    """The release's bookies know no READ_RANGE (protocol 3): the offloader reads their
    ledger entry by entry, and the object holds every entry."""
    await release_bookies(3)
    await client.store.set_offload_store(OffloadStoreSettings(f"file://{tmp_path}", 0))
    lh = await client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*(lh.append(b"old-%d" % i) for i in range(300)))
    await lh.close()
    settings = await client.store.read_offload_store()
    assert settings is not None
    done = await offload_ledger(
        client.context, client.objects, settings, lh.ledger_id, now=time.time, password=b"pw"
    )
    assert (done.outcome, done.entries) == ("released", 300)
    conns = [client.pool.get_nowait(bookie) for bookie in lh.metadata.ensemble]
    assert [conn.protocol_version for conn in conns if conn is not None] == [2, 2, 2]
    handle = await client.open_ledger(lh.ledger_id, b"pw")
    assert [e.data for e in await handle.read(0, 299)] == [b"old-%d" % i for i in range(300)]
