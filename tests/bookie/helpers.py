"""Small request builders for bookie tests, and ledger storage booted without a server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiobk.bookie import BookieConfig, OsDisk
from aiobk.bookie.journal.format import RecordType
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.journal.policy import GroupCommitPolicy
from aiobk.bookie.ledgers import Ledgers
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.client import BookieConnection, Digester
from aiobk.protocol import (
    AddFlag,
    AddRequest,
    AddResponse,
    DigestType,
    ReadFlag,
    ReadRequest,
    ReadResponse,
    master_key,
)

DIGEST = Digester(DigestType.CRC32C)
KEY = master_key(b"secret")
TIMEOUT = 10.0


def body(ledger: int, entry: int, payload: bytes, lac: int = -1) -> bytes:
    return DIGEST.encode(ledger, entry, lac, len(payload), payload)


def add_request(
    conn: BookieConnection,
    ledger: int,
    entry: int,
    payload: bytes,
    *,
    lac: int = -1,
    key: bytes = KEY,
    recovery: bool = False,
) -> AddRequest:
    flags = AddFlag.RECOVERY_ADD if recovery else AddFlag.NONE
    return AddRequest(
        conn.next_txn_id(),
        ledger,
        entry,
        flags,
        master_key=key,
        body=body(ledger, entry, payload, lac),
    )


async def add(
    conn: BookieConnection, ledger: int, entry: int, payload: bytes, **kw: object
) -> AddResponse:
    response = await conn.send(add_request(conn, ledger, entry, payload, **kw), TIMEOUT)  # type: ignore[arg-type]
    assert isinstance(response, AddResponse)
    return response


async def read(
    conn: BookieConnection,
    ledger: int,
    entry: int,
    *,
    flags: ReadFlag = ReadFlag.NONE,
    key: bytes = b"",
    previous_lac: int = -1,
    timeout_ms: int = 0,
) -> ReadResponse:
    request = ReadRequest(conn.next_txn_id(), ledger, entry, flags, key, previous_lac, timeout_ms)
    response = await conn.send(request, TIMEOUT + timeout_ms / 1000)
    assert isinstance(response, ReadResponse)
    return response


async def append_records(journal: Journal, payloads: list[bytes]) -> list[BaseException | None]:
    """Append ADD records; what each one's callback was given (None once synced)."""
    loop = asyncio.get_running_loop()
    futures = []
    for payload in payloads:
        future: asyncio.Future[BaseException | None] = loop.create_future()
        journal.append(RecordType.ADD, payload, future.set_result)
        futures.append(future)
    return await asyncio.gather(*futures)


@asynccontextmanager
async def booted_ledgers(
    data_dir: str,
    *,
    replay: bool = True,
    journal_file_size: int = 1 << 20,
    index: Callable[[OsDisk], Callable[[str], Any]] | None = None,
    **settings: Any,
) -> AsyncIterator[Ledgers]:
    """Ledger storage and a journal over ``data_dir``, booted as the bookie boots them (index,
    then the journal after its mark); stopped cleanly (no checkpoint) on exit. ``index``: makes
    the index engine's opener from the disk (default: the bookie's choice)."""
    config = BookieConfig(data_dir=data_dir, disk_reserved_space=0, **settings)
    disk = OsDisk()
    stats = BookieStats()
    opener: Callable[[str], Any] | None = index(disk) if index is not None else None
    storage = LedgerStorage(disk, config, stats, open_index=opener)
    journal = Journal(
        disk, config.journal_path, GroupCommitPolicy(), max_file_size=journal_file_size
    )
    ledgers = Ledgers(storage, journal, stats)
    await disk.makedirs(config.ledgers_path)
    mark = await storage.open()
    await journal.replay(
        mark, ledgers.apply if replay else lambda record: None, storage.journal_start
    )
    await journal.start(mark + 1)
    try:
        yield ledgers
    finally:
        await journal.stop()
        await storage.close()
        await disk.close()
