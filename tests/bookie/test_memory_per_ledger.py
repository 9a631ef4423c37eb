"""What a ledger a bookie holds costs it in memory (the wall a bookie once hit at 33 KB of RSS
per ledger must not come back unnoticed). A bookie process takes 20,000 small ledgers
through its request path (what any first load allocates once: connections, journal buffers,
the index engine's memtables and block cache, set small here), then 20,000 more,
checkpointing; the RSS growth per ledger over the second 20,000 is under 1 KB (measured
290-610 B). Locations and ledger records live in the on-disk index and idle ledger states are
dropped, so what is left grows with the engine's bounded caches, not with the ledgers; the
in-memory index of before cost 1.7-2.5 KB a ledger, for ever."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from aiobk.bench.cluster import start_bookie, stop_bookies
from aiobk.bench.scale import add_all

WARM_UP = 20_000
LEDGERS = 20_000
BOUND = 1024  # bytes of RSS per ledger held


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(180)
def test_a_held_ledger_costs_a_bounded_amount_of_memory(tmp_path: Path) -> None:
    config = tmp_path / "bookie.toml"
    config.write_text(
        "flush_interval = 1.0\ndisk_reserved_space = 0\n"
        "index_write_buffer_size = 4194304\nindex_cache_size = 4194304\n"
    )
    proc, port = start_bookie(str(tmp_path / "b"), extra=["--config", str(config)])
    try:
        time.sleep(1)
        warm_up = [(ledger, 0) for ledger in range(1, WARM_UP + 1)]
        assert asyncio.run(add_all(port, warm_up, 100, 512))[1] == 0
        time.sleep(2.5)
        idle = _rss(proc.pid)
        work = [(ledger, 0) for ledger in range(WARM_UP + 1, WARM_UP + LEDGERS + 1)]
        _seconds, errors = asyncio.run(add_all(port, work, 100, 512))
        assert errors == 0
        time.sleep(2.5)  # a checkpoint: the journal's records are in the index and released
        per_ledger = (_rss(proc.pid) - idle) / LEDGERS
    finally:
        stop_bookies([proc])
    print(f"RSS per ledger held: {per_ledger:.0f} bytes")
    assert per_ledger < BOUND
