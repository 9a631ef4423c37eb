"""What a read costs on a cold disk, for ``aiobk bench scale``: the floor (random 4 KiB preads
of a cold file on the same disk, each of a page not read before), the same bookie's reads
through its request path, and its ledger storage's reads with nothing cached.

The floor's preads are taken between the reads under test, so both come from the same minutes
of a noisy machine.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass

from aiobk.bench.floors import MIB, new_histogram
from aiobk.bench.resources import read_calls
from aiobk.bookie import BookieConfig
from aiobk.bookie.disk import OsDisk
from aiobk.bookie.index.rocks import RocksIndexDb
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.client import BookieConnection
from aiobk.protocol import HandshakeRequest, ReadRequest, StatusCode

SETTLE_SECONDS = 300.0  # at most, waiting for the index's compactions before the cold reads


def evict(path: str) -> None:
    """Drop a directory's files from the page cache (no root needed)."""
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except FileNotFoundError:
                continue  # a running bookie's index compaction removed it meanwhile
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


FLOOR_BYTES = 256 * MIB
FLOOR_PAGES = FLOOR_BYTES // 4096


@dataclass
class Floor:
    """The floor file and its pages not read yet in this run, in a random order: each pread of
    the floor reads a page never read before. Below this machine's page cache there is another
    (the host's, under a virtual disk) that keeps what was read: a page read again, evicted
    here, answered in 64-80 us (p50) where its first read took 182-218 us (300 random pages of
    a kept entry log and of the floor file, read, evicted, read again). A floor taken from pages
    the reads under test had just read would be cached below, and 20-40% low, while the reads
    under test each read pages no read had touched."""

    path: str
    pages: list[int]

    @classmethod
    def of(cls, path: str, seed: int = 7) -> Floor:
        pages = list(range(FLOOR_PAGES))
        random.Random(seed).shuffle(pages)
        return cls(path, pages)

    def take(self) -> int:
        """The offset of a page not read before."""
        return self.pages.pop() * 4096


def floor_file(directory: str) -> Floor:
    """A 256 MiB file of random bytes on the disk under test, synced (evicted before use)."""
    path = os.path.join(directory, "floor.bin")
    with open(path, "wb") as out:
        for _ in range(FLOOR_BYTES // MIB):
            out.write(os.urandom(MIB))
        out.flush()
        os.fsync(out.fileno())
    return Floor.of(path)


class ColdPreads:
    """Random 4 KiB preads of the cold floor file, one at a time, taken between the reads
    under test so both come from the same minutes of a noisy machine; each of a page not read
    before (``Floor``)."""

    def __init__(self, floor: Floor) -> None:
        self._floor = floor
        self._fd = os.open(floor.path, os.O_RDONLY)
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self.histogram = new_histogram()

    def sample(self) -> None:
        offset = self._floor.take()
        started = time.perf_counter_ns()
        os.pread(self._fd, 4096, offset)
        self.histogram.record_value(max(1, (time.perf_counter_ns() - started) // 1000))

    def close(self) -> float:
        """The p50 in microseconds."""
        os.close(self._fd)
        return float(self.histogram.get_value_at_percentile(50))


async def round_trips(port: int, samples: int) -> float:
    """p50 microseconds of a request that touches no storage (a handshake), one at a time: the
    part of a read the network and the two event loops take."""
    conn = await BookieConnection.open("127.0.0.1", port)
    histogram = new_histogram()
    try:
        for _ in range(samples):
            started = time.perf_counter_ns()
            await conn.send(HandshakeRequest(conn.next_txn_id()), 30)
            histogram.record_value(max(1, (time.perf_counter_ns() - started) // 1000))
    finally:
        conn.close()
    return float(histogram.get_value_at_percentile(50))


async def cold_reads(
    port: int, ledgers: list[int], entries: int, samples: int, floor: Floor | None = None
) -> tuple[float, float]:
    """p50 microseconds of one read of a random stored entry through the request path, one at a
    time, and of a cold pread of ``floor`` taken between them (0 without one)."""
    conn = await BookieConnection.open("127.0.0.1", port)
    rng = random.Random(11)
    histogram = new_histogram()
    preads = ColdPreads(floor) if floor is not None else None
    try:
        for _ in range(samples):
            if preads is not None:
                preads.sample()
            request = ReadRequest(conn.next_txn_id(), rng.choice(ledgers), rng.randrange(entries))
            started = time.perf_counter_ns()
            response = await conn.send(request, 30)
            histogram.record_value(max(1, (time.perf_counter_ns() - started) // 1000))
            assert response.status is StatusCode.EOK, response
    finally:
        conn.close()
        floor_p50 = preads.close() if preads is not None else 0.0
    return float(histogram.get_value_at_percentile(50)), floor_p50


async def storage_cold_reads(
    config_path: str, data_dir: str, ledgers: list[int], entries: int, samples: int, floor: Floor
) -> tuple[float, float, float, float]:
    """The same reads inside ledger storage, with the bookie's configuration, on its stopped
    data directory, nothing cached (page cache evicted, a fresh index, opened and left to finish
    the compactions the GC pass before started, then evicted again): a ledger's state looked
    up, then its entry read, as ``handle_read`` does. p50 microseconds, a cold pread's taken
    between them, and the read system calls a read made (this process's, the preads of the
    floor file taken out): two when the index holds what it needs to find the block -- the
    index's block and the entry's page -- and the read route reads on the event loop; three
    when it sends the read to a thread (its page-cache probe first, a ``preadv2`` with
    RWF_NOWAIT); more while the index's partitions load."""
    config = BookieConfig.from_toml(config_path, data_dir=data_dir)
    evict(config.ledgers_path)
    disk = OsDisk()
    storage = LedgerStorage(disk, config, BookieStats())
    await storage.open()
    # The GC pass just before left RocksDB compacting (its deletes); opened, it goes on. Reads
    # measured meanwhile would count that compaction's reads and share the disk with it: wait
    # until it is done, then drop what it cached.
    index = storage.index.db
    settled = time.monotonic()
    if isinstance(index, RocksIndexDb):
        for _ in range(int(SETTLE_SECONDS / 0.1)):  # RocksDB tells no one: ask it
            if not index.background_work():
                break
            await asyncio.sleep(0.1)
    settled = time.monotonic() - settled
    evict(config.ledgers_path)
    rng = random.Random(13)
    histogram = new_histogram()
    preads = ColdPreads(floor)
    calls = read_calls()
    try:
        for _ in range(samples):
            preads.sample()
            ledger_id, entry_id = rng.choice(ledgers), rng.randrange(entries)
            started = time.perf_counter_ns()
            state = storage.get(ledger_id)
            assert state is not None, ledger_id
            body = await storage.read_entry(state, entry_id, state.location(entry_id))
            histogram.record_value(max(1, (time.perf_counter_ns() - started) // 1000))
            assert body is not None, (ledger_id, entry_id)
    finally:
        await storage.close()
        await disk.close()
        floor_p50 = preads.close()
        calls = read_calls() - calls - samples
    return float(histogram.get_value_at_percentile(50)), floor_p50, calls / samples, settled
