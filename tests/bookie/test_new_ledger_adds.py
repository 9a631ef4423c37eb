"""The first adds of a ledger new to a bookie cost no index lookup each.

They arrive while the bookie reads the ledger's metadata (its key check) and wait behind
that lookup. Each one used to ask the index for the ledger's state first -- a RocksDB miss,
dearer the more the bookie holds: a loaded bookie's adds ran at 0.8x an empty one's in
``aiobk bench scale``. Now only the first asks; the rest see the lookup under way."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aiobk.bookie import Bookie, BookieConfig
from aiobk.client import BookieConnection
from aiobk.metadata import Fragment, LedgerMetadata, MemoryKV, open_store
from aiobk.protocol import StatusCode
from aiobk.protocol.keys import key_digest
from tests.bookie.helpers import KEY, TIMEOUT, add_request
from tests.support.names import unique_name
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(60)

LEDGER = 7
ADDS = 200
SALT = b"n" * 16


async def test_adds_waiting_on_a_lookup_do_not_each_look_the_ledger_up(tmp_path: Path) -> None:
    name = unique_name("newledger")
    uri = f"memory://{name}"
    store = open_store(uri)
    await store.create_ledger(
        LEDGER,
        LedgerMetadata(
            1, 1, 1, (Fragment(0, ("b",)),), password_digest=key_digest(SALT, KEY),
            password_salt=SALT,
        ),
    )  # fmt: skip
    bookie = Bookie(BookieConfig(data_dir=str(tmp_path / "b"), port=0, metadata_uri=uri))
    await bookie.start()
    conn = await BookieConnection.open(*bookie.address)
    try:
        metadata = bookie.context.admin.metadata
        assert metadata is not None
        gate = asyncio.Event()
        read_ledger = metadata.read_ledger

        async def held_read(ledger_id: int) -> Any:
            await gate.wait()
            return await read_ledger(ledger_id)

        metadata.read_ledger = held_read  # type: ignore[method-assign]
        index = bookie.storage.index
        state_lookups = 0
        index_state = index.state

        def counted(ledger_id: int) -> Any:
            nonlocal state_lookups
            if ledger_id == LEDGER:
                state_lookups += 1
            return index_state(ledger_id)

        index.state = counted  # type: ignore[method-assign]
        sends = [
            asyncio.ensure_future(conn.send(add_request(conn, LEDGER, entry, b"x"), TIMEOUT))
            for entry in range(ADDS)
        ]
        keys = bookie.context.keys
        await wait_until(
            lambda: keys.waiting == ADDS, every=0.01, timeout=10, what=f"{ADDS} adds waiting"
        )
        assert keys.looking_up(LEDGER)
        assert state_lookups == 1  # the first add's, which started the lookup
        gate.set()
        answers = await asyncio.gather(*sends)
        assert [a.status for a in answers] == [StatusCode.EOK] * ADDS
        assert [a.entry_id for a in answers] == list(range(ADDS))
        assert not keys.looking_up(LEDGER)
        # The first admitted add creates the state (one more lookup, in ``ensure``); the rest
        # find it in memory.
        assert state_lookups == 2
    finally:
        conn.close()
        await bookie.stop()
        await store.close()
        MemoryKV.forget(name)
