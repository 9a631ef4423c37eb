"""A bookie of this tree opening the data directory a release's bookie wrote: after a clean stop
(SIGTERM: a checkpoint, then the index and entry logs), after SIGKILL (the journal replayed),
and, for a bookie without the journal's data, after SIGKILL (BP-46's boot: fence, limbo, and the
copy back from its peers, which run the release).

The release's client writes through three of the release's bookies with ack quorum 3 and dies
with one ledger open; one bookie stops and a bookie of this tree takes its directory and port.
Once it has repaired itself and the open ledger is recovered, the two others stop: it alone then
serves every acknowledged entry and takes new writes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aiobk import BookKeeper
from aiobk.bookie import Bookie
from tests.compat.driver import run_steps
from tests.compat.harness import Release, log_tail
from tests.support.procs import BookieProcess

LARGE = 96 * 1024  # a few entries larger than a page of the index and the read cache's slots


def payloads(tag: str, count: int, size: int = 0) -> list[str]:
    return [f"{tag}-{i}".ljust(size, ".") for i in range(count)]


# Every copy on every bookie, acknowledged by all three (E = WQ = AQ = 3).
LEDGERS: dict[str, list[str]] = {
    "closed": payloads("c", 200) + payloads("big", 6, LARGE) + payloads("c2", 50),
    "volatile": payloads("v", 30),
    "fenced": payloads("f", 5),
    "open": payloads("o", 50),
}

WRITE: list[dict[str, Any]] = [
    {"op": "create", "as": "closed", "ensemble": [3, 3, 3], "password": "pw"},
    {"op": "append", "ledger": "closed", "payloads": LEDGERS["closed"]},
    {"op": "close", "ledger": "closed"},
    {"op": "create", "as": "volatile", "ensemble": [3, 3, 3], "durability": "volatile"},
    {"op": "append", "ledger": "volatile", "payloads": LEDGERS["volatile"]},
    {"op": "force", "ledger": "volatile"},
    {"op": "close", "ledger": "volatile"},
    {"op": "create", "as": "fenced", "ensemble": [3, 3, 3]},
    {"op": "append", "ledger": "fenced", "payloads": LEDGERS["fenced"]},
    {"op": "open", "as": "recovered", "ledger": "fenced"},
    {"op": "create", "as": "open", "ensemble": [3, 3, 3], "password": "pw"},
    {"op": "append", "ledger": "open", "payloads": LEDGERS["open"]},
    # Idle, the writer sends its explicit LAC: a recovery then has nothing to write back, so
    # what the new bookie serves afterwards is what it kept, not what recovery copied to it.
    {"op": "await_lac", "ledger": "open", "password": "pw"},
    {"op": "exit"},  # the ledger "open" stays open
]
IDS = {"closed": 0, "volatile": 3, "fenced": 7, "open": 10}  # the create steps' results
PASSWORDS = {"closed": "pw", "open": "pw"}


def recover(ids: dict[str, int]) -> list[dict[str, Any]]:
    return [{"op": "open", "as": "open", "ledger_id": ids["open"], "password": "pw"}]


def read_back(ids: dict[str, int]) -> list[dict[str, Any]]:
    """Open every ledger without fencing and read it whole; then write a new one."""
    steps: list[dict[str, Any]] = []
    for name, ledger_id in ids.items():
        password = PASSWORDS.get(name, "")
        steps.append({"op": "open", "as": name, "ledger_id": ledger_id, "password": password,
                      "recovery": False})  # fmt: skip
        steps.append({"op": "read", "handle": name})
    steps += [
        {"op": "create", "as": "new", "ensemble": [1, 1, 1]},
        {"op": "append", "ledger": "new", "payloads": payloads("n", 10)},
        {"op": "close", "ledger": "new"},
        {"op": "open", "as": "rnew", "ledger": "new", "recovery": False},
        {"op": "read", "handle": "rnew"},
    ]
    return steps


def check_read_back(ids: dict[str, int], results: list[dict[str, Any]]) -> None:
    for i, name in enumerate(ids):
        opened, read = results[2 * i], results[2 * i + 1]
        assert opened["closed"], (name, opened)
        assert opened["lac"] == len(LEDGERS[name]) - 1, (name, opened)
        assert read["data"] == LEDGERS[name], name
    assert results[-1]["data"] == payloads("n", 10)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("journal", "stop"),
    [(True, "sigterm"), (True, "sigkill"), (False, "sigkill")],
    ids=["journal-sigterm", "journal-sigkill", "no-journal-data-sigkill"],
)
async def test_head_bookie_opens_release_data_dir(
    release: Release,
    uri: str,
    release_bookies: Callable[..., Awaitable[list[BookieProcess]]],
    head_bookies: Callable[..., Awaitable[list[Bookie]]],
    client: BookKeeper,
    journal: bool,
    stop: str,
) -> None:
    # Every release tested has journal-less bookies (BP-46): the case never goes unrun.
    assert journal or "journal_write_data" in release.bookie_settings, release.version
    old, *peers = await release_bookies(3, *([] if journal else ["--no-journal-write-data"]))
    results = await release.run(uri, WRITE)
    for name, index in IDS.items():
        assert results[index + 1]["entry_ids"] == list(range(len(LEDGERS[name])))
    ids = {name: results[index]["ledger_id"] for name, index in IDS.items()}
    if stop == "sigterm":
        assert old.terminate() == 0, log_tail(old)
    else:
        old.kill()

    (new,) = await head_bookies(1, data_dir=old.data_dir, port=old.port, journal_write_data=journal)
    await new.wait_repaired()
    (recovered,) = await run_steps(client, recover(ids))
    assert recovered["lac"] == len(LEDGERS["open"]) - 1
    codes = await asyncio.gather(*(asyncio.to_thread(peer.terminate) for peer in peers))
    assert codes == [0, 0], [log_tail(peer) for peer in peers]
    check_read_back(ids, await run_steps(client, read_back(ids)))
