"""This tree's client on ledgers whose metadata a release's client wrote: closed, open, and left
IN_RECOVERY by a recovery that could not finish -- read, password-checked, recovered, deleted.
The bookies are this tree's (the wire is tests/compat/test_wire.py's concern)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aiobk import BookKeeper, errors
from aiobk.bookie import Bookie
from aiobk.metadata import LedgerState
from tests.compat.conftest import CLIENT_CONFIG
from tests.compat.driver import run_steps
from tests.compat.harness import Release


def payloads(tag: str, count: int) -> list[str]:
    return [f"{tag}-{i}" for i in range(count)]


WRITE: list[dict[str, Any]] = [
    {"op": "create", "as": "closed", "ensemble": [3, 3, 2], "password": "pw",
     "custom": {"app": "orders"}},
    {"op": "append", "ledger": "closed", "payloads": payloads("c", 20)},
    {"op": "close", "ledger": "closed"},
    {"op": "create", "as": "open", "ensemble": [3, 3, 2], "password": "pw"},
    {"op": "append", "ledger": "open", "payloads": payloads("o", 10)},
    {"op": "create", "as": "recovering", "ensemble": [3, 3, 2]},
    {"op": "append", "ledger": "recovering", "payloads": payloads("r", 7)},
    {"op": "await_lac", "ledger": "open", "password": "pw"},
    {"op": "await_lac", "ledger": "recovering"},
    {"op": "exit"},
]  # fmt: skip


@pytest.mark.timeout(90)
async def test_head_client_on_release_ledger_metadata(
    release: Release,
    uri: str,
    head_bookies: Callable[..., Awaitable[list[Bookie]]],
    client: BookKeeper,
) -> None:
    bookies = await head_bookies(3)
    written = await release.run(uri, WRITE)
    closed, open_, recovering = (written[i]["ledger_id"] for i in (0, 3, 5))

    # Two of three bookies gone: the release's recovery marks the ledger IN_RECOVERY, then
    # cannot fence an ack quorum, and leaves it so.
    stopped = bookies[1:]
    for bookie in stopped:
        await bookie.stop()
    (failed,) = await release.run(
        uri,
        [{"op": "open", "as": "r", "ledger_id": recovering, "expect_error": True}],
        CLIENT_CONFIG,
    )
    assert "error" in failed, failed
    for bookie in stopped:
        await head_bookies(1, data_dir=bookie.config.data_dir, port=bookie.address.port)
    handle = await client.open_ledger(recovering, recovery=False)
    assert handle.metadata.state is LedgerState.IN_RECOVERY
    assert not handle.is_closed

    # Closed: its metadata, its password (the digest the release kept), its entries.
    with pytest.raises(errors.UnauthorizedError):
        await client.open_ledger(closed, password=b"wrong", recovery=False)
    handle = await client.open_ledger(closed, password=b"pw", recovery=False)
    assert handle.is_closed
    assert handle.last_add_confirmed == 19
    assert dict(handle.metadata.custom_metadata) == {"app": b"orders"}
    assert [e.data.decode() for e in await handle.read(0, 19)] == payloads("c", 20)

    steps: list[dict[str, Any]] = [
        # Open: read to the LAC without fencing, then recovered.
        {"op": "open", "as": "o", "ledger_id": open_, "password": "pw", "recovery": False},
        {"op": "read", "handle": "o"},
        {"op": "open", "as": "o2", "ledger_id": open_, "password": "pw"},
        {"op": "read", "handle": "o2"},
        # In recovery: this tree's recovery finishes what the release's began.
        {"op": "open", "as": "r", "ledger_id": recovering},
        {"op": "read", "handle": "r"},
    ]
    results = await run_steps(client, steps)
    assert results[0] == {"ledger_id": open_, "closed": False, "lac": 9}
    assert results[1]["data"] == payloads("o", 10)
    assert results[2] == {"ledger_id": open_, "closed": True, "lac": 9}
    assert results[3]["data"] == payloads("o", 10)
    assert results[4] == {"ledger_id": recovering, "closed": True, "lac": 6}
    assert results[5]["data"] == payloads("r", 7)

    assert {closed, open_, recovering} <= {i async for i in client.list_ledgers()}
    with pytest.raises(errors.UnauthorizedError):
        await client.delete_ledger(closed, b"wrong")
    await client.delete_ledger(closed, b"pw")
    await client.delete_ledger(recovering)
    assert {i async for i in client.list_ledgers()} == {open_}
