"""Reading big ranges in bounded memory: ``read_iter``
streams with a prefetch window bounded by entries and bytes, ``read()`` refuses past
``max_read_bytes``, ``read_from`` streams too."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from aiobk.client.errors import NoSuchEntryError, ReadTooLargeError
from aiobk.protocol import ReadFlag, ReadRequest

KiB = 1024


def entry_reads(bookies) -> int:
    """Plain entry reads the fake bookies have served (no LAC reads, long polls or fences)."""
    return sum(
        1
        for bookie in bookies
        for r in bookie.processed
        if isinstance(r, ReadRequest) and r.entry_id >= 0 and not r.flags & ReadFlag.FENCE
    )


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def write(world, count: int, size: int = KiB):
    bk = await world.client()
    lh = await bk.create_ledger(3, 3, 2)
    await asyncio.gather(*(lh.append(payload(i, size)) for i in range(count)))
    await lh.close()
    return lh


def payload(i: int, size: int = KiB) -> bytes:
    return b"%06d" % i + b"." * (size - 6)


async def test_read_iter_yields_every_entry_in_order(world) -> None:
    await world.bookies(3)
    lh = await write(world, 300)
    reader = await world.client(seed=2, read_concurrency=7)
    rh = await reader.open_ledger(lh.ledger_id)
    got = [e async for e in rh.read_iter(0, 299)]
    assert [e.entry_id for e in got] == list(range(300))
    assert [e.data for e in got] == [payload(i) for i in range(300)]
    assert [e.data async for e in rh.read_iter(17, 17)] == [payload(17)]
    with pytest.raises(NoSuchEntryError):
        rh.read_iter(0, 300)  # past the LAC: refused at the call, as read() does


async def test_read_iter_fetches_ahead_within_the_byte_bound(world) -> None:
    bookies = await world.bookies(3)
    lh = await write(world, 100)
    reader = await world.client(
        seed=2, read_ahead_bytes=4 * KiB, read_concurrency=64, speculative_read_timeout=30.0
    )
    rh = await reader.open_ledger(lh.ledger_id)
    before = entry_reads(bookies)
    async with contextlib.aclosing(rh.read_iter(0, 99)) as stream:
        assert (await anext(stream)).entry_id == 0
        await settle()
        assert entry_reads(bookies) - before == 1  # the first alone: its size is unknown
        assert (await anext(stream)).entry_id == 1
        await settle()
        # Entry 1 handed over; 2, 3 and 4 fetched ahead: four 1 KiB entries in the window.
        assert entry_reads(bookies) - before == 5
    await settle()
    assert entry_reads(bookies) - before == 5  # closed early: nothing more asked


async def test_read_iter_fetches_ahead_within_the_entry_bound(world) -> None:
    bookies = await world.bookies(3)
    lh = await write(world, 100)
    reader = await world.client(seed=2, read_concurrency=4, speculative_read_timeout=30.0)
    rh = await reader.open_ledger(lh.ledger_id)
    before = entry_reads(bookies)
    async with contextlib.aclosing(rh.read_iter(0, 99)) as stream:
        for expected in range(10):
            assert (await anext(stream)).entry_id == expected
            await settle()
            assert entry_reads(bookies) - before <= expected + 1 + 4


async def test_read_refuses_past_max_read_bytes_and_names_read_iter(world) -> None:
    bookies = await world.bookies(3)
    lh = await write(world, 100)
    reader = await world.client(
        seed=2, max_read_bytes=8 * KiB, read_concurrency=4, speculative_read_timeout=30.0
    )
    rh = await reader.open_ledger(lh.ledger_id)
    assert [e.data for e in await rh.read(0, 7)] == [payload(i) for i in range(8)]  # 8 KiB: ok
    before = entry_reads(bookies)
    with pytest.raises(ReadTooLargeError, match=r"read_iter\(0, 99\)"):
        await rh.read(0, 99)
    await settle()
    assert entry_reads(bookies) - before <= 9 + 4  # it stopped as soon as it knew
    assert len([e async for e in rh.read_iter(0, 99)]) == 100  # the way out it names


async def test_read_from_streams_within_the_window(world) -> None:
    bookies = await world.bookies(3)
    lh = await write(world, 300)
    reader = await world.client(seed=2, read_concurrency=8, speculative_read_timeout=30.0)
    rh = await reader.open_ledger(lh.ledger_id)
    before = entry_reads(bookies)
    tail = rh.read_from(0)
    async with contextlib.aclosing(tail):
        assert (await anext(tail)).entry_id == 0
        await settle()
        assert entry_reads(bookies) - before <= 1 + 8  # not a batch of 256 at once
        rest = [e async for e in tail]
    assert [e.entry_id for e in rest] == list(range(1, 300))
    assert [e.data for e in rest] == [payload(i) for i in range(1, 300)]


async def test_read_from_follows_a_live_writer(world) -> None:
    await world.bookies(3)
    writer = await world.client()
    lh = await writer.create_ledger(3, 3, 2)
    await lh.append(b"0")
    reader = await world.client(seed=2, long_poll_timeout=0.2)
    rh = await reader.open_ledger(lh.ledger_id, recovery=False)
    seen: list[bytes] = []

    async def follow() -> None:
        async for entry in rh.read_from(0):
            seen.append(entry.data)

    following = asyncio.ensure_future(follow())
    for i in range(1, 20):
        await lh.append(b"%d" % i)
    await lh.close()
    async with asyncio.timeout(30):
        await following
    assert seen == [b"%d" % i for i in range(20)]
