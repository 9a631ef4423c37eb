"""A whole rack lost, with real processes: a real etcd and six bookie processes over three racks
(three, two and one bookies; the rack given in the TOML file or by ``--rack``), autorecovery
running beside each. A writer that places at random (as a client unaware of racks does) writes
ledgers of E=3 WQ=3 AQ=2, some on one rack; both bookies of the middle rack are SIGKILLed;
every entry still reads back, and within a bounded time autorecovery has moved the lost rack's
copies and spread the rest, so that no ledger names a dead bookie, no mark is left, and every
write set spans two racks again over the two racks left -- which takes the one bookie of the
small rack in every ensemble: a replacement or move chosen without racks would miss it.
(E=3 WQ=2 could not: its three write sets form a ring of odd length, which two racks cannot
alternate round.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, ClientConfig, ProtocolSwitches
from aiobk.client.placement import Spread, spread_of
from aiobk.metadata import EtcdProcess, MetadataStore
from tests.autorecovery.helpers import assert_copies
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess
from tests.support.wait import wait_until

RACKS = ("/dc/a",) * 3 + ("/dc/b",) * 2 + ("/dc/c",)
VICTIM = "/dc/b"
LEDGERS = 10
ENTRIES = 30
FAST: dict[str, float] = {"registration_ttl": 1.0}  # etcd raises it to its minimum (2 s)
AUTORECOVERY: dict[str, float] = {
    "lost_bookie_recovery_delay": 1.0,
    "autorecovery_poll_interval": 0.2,
    "rereplication_retry_delay": 0.2,
    "autorecovery_lease_ttl": 2.0,
}
REPAIR_BOUND = 40.0  # seconds from the kill until the spread is back
READER = ClientConfig(read_timeout=1.0, speculative_read_timeout=0.1, connect_timeout=0.5)
AT_RANDOM = ClientConfig(switches=ProtocolSwitches(spread_over_racks=False))


def _payload(ledger_id: int, entry_id: int) -> bytes:
    return b"ledger %d entry %d " % (ledger_id, entry_id) + bytes(100)


class RackedCluster:
    """Six bookie processes over three racks (``RACKS``), autorecovery on in each."""

    def __init__(self, root: Path, uri: str) -> None:
        self.uri = uri
        self.procs: dict[str, BookieProcess] = {}
        self.racks: dict[str, str] = {}
        for i, rack in enumerate(RACKS):
            data, config = root / f"bookie{i}", root / f"bookie{i}.toml"
            settings: dict[str, object] = {**HOST_DISK_SETTINGS, **FAST}
            flags: list[str] = []
            if i % 2:
                flags = ["--rack", rack]
            else:
                settings["rack"] = rack
            config.write_text(
                "".join(f"{k} = {v!r}\n" for k, v in settings.items())
                + "[autorecovery]\n"
                + "".join(f"{k} = {v!r}\n" for k, v in AUTORECOVERY.items())
            )
            proc = BookieProcess(data, None, "--metadata", uri, "--config", str(config), *flags)
            bookie_id = f"127.0.0.1:{proc.port}"
            self.procs[bookie_id] = proc
            self.racks[bookie_id] = rack

    async def start(self) -> None:
        await asyncio.gather(*(p.start(timeout=60) for p in self.procs.values()))

    def kill_rack(self, rack: str) -> list[str]:
        """SIGKILL every bookie of ``rack``; their ids."""
        victims = [b for b, r in self.racks.items() if r == rack]
        for bookie_id in victims:
            self.procs.pop(bookie_id).kill()
        return victims

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.stop()


@pytest.fixture
async def cluster(etcd_server: EtcdProcess, tmp_path: Path) -> AsyncIterator[RackedCluster]:
    cluster = RackedCluster(tmp_path, etcd_server.uri(unique_name("racks-procs")))
    try:
        await cluster.start()
        yield cluster
    finally:
        cluster.stop()


async def _state(
    store: MetadataStore, ids: list[int], dead: set[str], spread: Spread
) -> tuple[list[int], list[int]]:
    """The ledgers still naming a dead bookie, and those with a write set on one rack."""
    naming, narrow = [], []
    for ledger_id in ids:
        metadata = await store.read_ledger(ledger_id)
        if any(dead & set(f.ensemble) for f in metadata.fragments):
            naming.append(ledger_id)
        if any(
            spread_of(f.ensemble, metadata.write_quorum, spread)[0] < 2 for f in metadata.fragments
        ):
            narrow.append(ledger_id)
    return naming, narrow


@pytest.mark.timeout(120)
async def test_a_whole_rack_killed_reads_on_and_the_spread_comes_back(
    cluster: RackedCluster,
) -> None:
    loop = asyncio.get_running_loop()
    async with await BookKeeper.connect(cluster.uri, AT_RANDOM) as bk:
        registered = {info.bookie_id: info.rack for info in await bk.store.list_bookies()}
        assert registered == cluster.racks
        ids = []
        for _ in range(LEDGERS):
            lh = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            await asyncio.gather(*(lh.append(_payload(lh.ledger_id, i)) for i in range(ENTRIES)))
            await lh.close()
            ids.append(lh.ledger_id)
        spread = Spread(cluster.racks)
        dead = set(cluster.kill_rack(VICTIM))
        killed = loop.time()
        async with await BookKeeper.connect(cluster.uri, READER) as reader:
            for ledger_id in ids:
                rh = await reader.open_ledger(ledger_id, recovery=False)
                entries = await asyncio.wait_for(rh.read(0, ENTRIES - 1), 30)
                assert [x.data for x in entries] == [_payload(ledger_id, i) for i in range(ENTRIES)]
        read_back = loop.time() - killed

        seen: list[object] = []

        async def spread_again() -> bool:
            naming, narrow = await _state(bk.store, ids, dead, spread)
            marks = [mark async for mark in bk.store.autorecovery.marks()]
            seen[:] = [naming, narrow, marks]
            return not naming and not narrow and not marks

        await wait_until(
            spread_again,
            timeout=REPAIR_BOUND - (loop.time() - killed),
            every=0.2,
            what=lambda: f"spread again: naming {dead}, on one rack, marks: {seen}",
        )
        took = loop.time() - killed
        print(
            f"read back {len(ids)} ledgers in {read_back:.1f}s; "
            f"spread again {took:.1f}s after the kill"
        )
        for ledger_id in ids:
            await assert_copies(bk, ledger_id, read_back=False)
