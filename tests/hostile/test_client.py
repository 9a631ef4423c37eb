"""A heavy legitimate client against real bookie processes: many appends queued at once, megabyte
appends over many ledgers, a big range read. Each asserts completion and the client's own peak
memory (VmHWM of this process, reset before the step; the bookies are other processes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, ClientConfig
from aiobk.client.errors import ReadTooLargeError
from tests.support.names import unique_name
from tests.support.procs import BookieProcess

MiB = 1024 * 1024


def reset_peak() -> int:
    """Reset this process's peak RSS (Linux clear_refs 5); return its RSS now, in bytes."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    return _status("VmRSS")


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def peak_growth(baseline: int) -> int:
    return _status("VmHWM") - baseline


@pytest.fixture
async def bookies_uri(etcd_server, tmp_path: Path) -> AsyncIterator[str]:
    """Three bookie processes registered in a fresh prefix of the session's etcd."""
    uri = etcd_server.uri(unique_name("hostileclient"))
    procs = [BookieProcess(tmp_path / f"b{i}", None, "--metadata", uri) for i in range(3)]
    try:
        for proc in procs:
            await proc.start()
        yield uri
    finally:
        for proc in procs:
            if proc.process is not None and proc.process.poll() is None:
                await asyncio.to_thread(proc.terminate)


@pytest.mark.timeout(300)
async def test_a_hundred_thousand_appends_queued_at_once_all_complete(bookies_uri: str) -> None:
    """Before the fix, with the default 10,000 outstanding adds, 100,000 x 1 KiB appends
    submitted at once got 7,214 acknowledgements in 74 s at 100% CPU, then timeouts."""
    async with await BookKeeper.connect(bookies_uri) as bk:
        lh = await bk.create_ledger(3, 3, 2)
        payload = b"x" * 1024
        loop = asyncio.get_running_loop()
        started = loop.time()
        ids = await asyncio.gather(*(lh.append(payload) for _ in range(100_000)))
        elapsed = loop.time() - started
        assert ids == list(range(100_000))
        assert elapsed < 150, f"{elapsed:.1f}s"  # about 15-20 s here; never a stall
        await lh.close()


@pytest.mark.timeout(300)
async def test_megabyte_appends_over_many_ledgers_stay_within_the_byte_budget(
    bookies_uri: str,
) -> None:
    """Bytes: 1 MiB appends used to cost the client about their size each (3 GiB after 3,063
    submitted); the budget is one per client, whatever the number of ledgers."""
    budget = 16 * MiB
    config = ClientConfig(max_outstanding_bytes=budget)
    async with await BookKeeper.connect(bookies_uri, config) as bk:
        handles = [await bk.create_ledger(3, 3, 2) for _ in range(10)]
        payload = b"m" * MiB  # one object: what grows is the client's own memory
        baseline = reset_peak()
        appends = [handles[i % 10].append(payload) for i in range(400)]
        ids = await asyncio.gather(*appends)
        growth = peak_growth(baseline)
        assert sorted(ids) == sorted(list(range(40)) * 10)
        # The budget's frames, encoding copies and 400 waiting tasks; 400 MiB before.
        assert growth < 3 * budget, f"peak growth {growth / MiB:.0f} MiB"
        for handle in handles:
            await handle.close()


@pytest.mark.timeout(300)
async def test_a_big_range_streams_in_flat_memory_and_read_refuses_it(bookies_uri: str) -> None:
    """read(0, 99) of 1 MiB entries used to hold the whole range."""
    async with await BookKeeper.connect(bookies_uri) as bk:
        lh = await bk.create_ledger(3, 3, 2)
        for start in range(0, 100, 10):
            await asyncio.gather(
                *(lh.append(b"%03d" % i * (MiB // 3)) for i in range(start, start + 10))
            )
        await lh.close()
    config = ClientConfig(max_read_bytes=32 * MiB, read_ahead_bytes=8 * MiB)
    async with await BookKeeper.connect(bookies_uri, config) as bk:
        rh = await bk.open_ledger(lh.ledger_id)
        baseline = reset_peak()
        count = 0
        async with contextlib.aclosing(rh.read_iter(0, 99)) as entries:
            async for entry in entries:
                assert entry.data == b"%03d" % count * (MiB // 3)
                count += 1
        growth = peak_growth(baseline)
        assert count == 100
        assert growth < 32 * MiB, f"read_iter peak growth {growth / MiB:.0f} MiB"  # 100 MiB read

        baseline = reset_peak()
        with pytest.raises(ReadTooLargeError, match="read_iter"):
            await rh.read(0, 99)
        growth = peak_growth(baseline)
        assert growth < 32 * MiB + 24 * MiB, f"read() peak growth {growth / MiB:.0f} MiB"
