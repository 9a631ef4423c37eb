"""Digests are verified when copying: a replication worker copying a lost bookie's
share never puts a damaged copy on the replacement. Real bookies on a real etcd; the worker is
driven directly, one repair at a time, as in ``test_worker``.

Two kinds of damage, each made where it happens for real:

- a copy stored with bytes that do not match its digest (damaged on its way to the bookie,
  which stores what it gets: a writer's network that flips a bit, ``ManglingConnector``); the
  bookie serves it as it is, and only the digest can tell;
- a copy damaged on disk after it was stored (a byte flipped in the entry log): the bookie's
  own checksum catches it and it answers EIO.

With a good copy elsewhere the good one is copied. With every copy damaged nothing is written
for that entry: it is reported lost with its range (the mark keeps the report) and not tried
again -- a digest mismatch at once, an EIO (which a failing disk may also give for a while)
after ``DAMAGED_ATTEMPTS`` attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from aiobk.autorecovery import AutoRecoveryConfig, Outcome, ReplicationWorker
from aiobk.autorecovery.status import LostLedger, gather_status
from aiobk.autorecovery.worker import DAMAGED_ATTEMPTS
from aiobk.bookie import Bookie
from aiobk.bookie.entrylog.format import RECORD_HEAD, log_name, unpack_location
from aiobk.client import BookKeeper, ClientConfig
from aiobk.client.digest import Digester
from aiobk.client.entry_read import ask, verified
from aiobk.client.net import AsyncioConnector, P
from aiobk.metadata import LOST_BOOKIE, EtcdProcess, LedgerMetadata, write_set
from aiobk.protocol import (
    HEADER_SIZE,
    AddRequest,
    DigestType,
    FrameDecoder,
    StatusCode,
    decode_request,
    encode,
    frame,
)
from aiobk.protocol.errors import DigestMismatchError
from tests.autorecovery.watching import unregistered, watching_marks
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name

SETTINGS = {"registration_ttl": 1.0, "autorecovery_enabled": False}
CONFIG = AutoRecoveryConfig(
    lost_bookie_recovery_delay=0.0,
    rereplication_retry_delay=0.2,
    autorecovery_poll_interval=0.1,
)
ENTRIES = 10
DAMAGED = 4  # the entry whose copies are damaged
LOST_SLOT = 2  # the slot of the bookie lost for good


# ------------------------------------------------------------------ a writer's faulty network


class _MangledTransport:
    def __init__(self, inner: asyncio.Transport, address: str, owner: ManglingConnector) -> None:
        self._inner = inner
        self._address = address
        self._owner = owner
        self._decoder = FrameDecoder()

    def write(self, data: Any) -> None:
        out = []
        for payload in self._decoder.feed(bytes(data)):
            request = decode_request(payload)
            key = (
                self._address,
                getattr(request, "ledger_id", None),
                getattr(request, "entry_id", None),
            )
            if isinstance(request, AddRequest) and key in self._owner.targets:
                body = bytearray(request.body)
                body[-1] ^= 0x01  # the last payload byte
                out.append(encode(dataclasses.replace(request, body=bytes(body))))
                self._owner.mangled.append(key)
            else:
                out.append(frame(payload))
        self._inner.write(b"".join(out))

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(bytes(chunk) for chunk in chunks))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ManglingConnector:
    """Real TCP, but the adds of chosen (bookie address, ledger, entry) get one bit flipped."""

    def __init__(self) -> None:
        self.targets: set[tuple[str, int | None, int | None]] = set()
        self.mangled: list[tuple[str, int | None, int | None]] = []

    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]:
        transport, protocol = await AsyncioConnector().connect(factory, host, port)
        wrapper = _MangledTransport(transport, f"{host}:{port}", self)
        protocol._transport = wrapper  # type: ignore[attr-defined]  # the client's connection
        return wrapper, protocol  # type: ignore[return-value]


# ------------------------------------------------------------------ fixtures and helpers


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdProcess) -> AsyncIterator[Cluster]:
    uri = etcd_server.uri(unique_name("integrity"))
    cluster = await start_cluster(tmp_path, 5, uri=uri, **SETTINGS)
    yield cluster
    await cluster.stop()


@pytest.fixture
async def bk(cluster: Cluster) -> AsyncIterator[BookKeeper]:
    async with BookKeeper(cluster.uri, ClientConfig(read_timeout=2.0, add_timeout=2.0)) as bk:
        yield bk


def _worker(bk: BookKeeper) -> ReplicationWorker:
    return ReplicationWorker(
        bk.context,
        CONFIG,
        "test-worker",
        wall_clock=time.time,
        secret_bytes=random.Random(5).randbytes,
        poll_interval=CONFIG.autorecovery_poll_interval,
    )


def _sources(metadata: LedgerMetadata, entry_id: int) -> list[str]:
    """The bookies a worker reads ``entry_id`` from for the lost slot, in the order it asks."""
    ensemble = metadata.fragments[0].ensemble
    slots = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
    return [ensemble[s] for s in slots if s != LOST_SLOT]


async def _ledger(cluster: Cluster, mangle: int = 0) -> tuple[int, LedgerMetadata]:
    """A closed E3 WQ3 AQ3 ledger (every add on all three before it returns), the copies of
    ``DAMAGED`` sent to its first ``mangle`` sources with a bit flipped on the way."""
    net = ManglingConnector()
    async with BookKeeper(cluster.uri, connector=net) as writer:
        lh = await writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        for bookie_id in _sources(lh.metadata, DAMAGED)[:mangle]:
            address = str(cluster.by_id(bookie_id).address)
            net.targets.add((address, lh.ledger_id, DAMAGED))
        for i in range(ENTRIES):
            await lh.append(b"entry %d of the ledger" % i)
        await lh.close()
    assert len(net.mangled) == mangle
    return lh.ledger_id, lh.metadata


async def _damage_on_disk(cluster: Cluster, bookie: Bookie, ledger_id: int) -> Bookie:
    """Flip a payload byte of ``DAMAGED`` in the bookie's entry log (stopped cleanly first, so
    the entry is in the file); the bookie restarted on it."""
    log_id, offset = unpack_location(bookie.storage.ledgers[ledger_id].location(DAMAGED))
    await bookie.stop()
    path = Path(bookie.config.ledgers_path) / "entries" / log_name(log_id)
    data = bytearray(path.read_bytes())
    data[offset + RECORD_HEAD.size + HEADER_SIZE + DigestType.CRC32C.size + 2] ^= 0x20
    path.write_bytes(bytes(data))
    return await cluster.restart(bookie)


async def _lose(cluster: Cluster, bk: BookKeeper, bookie_id: str) -> None:
    """Gone for good: crashed, its disk gone, out of the registry."""
    bookie = cluster.by_id(bookie_id)
    cluster.bookies.remove(bookie)
    await bookie.crash()
    shutil.rmtree(bookie.config.data_dir)
    await unregistered(bk.store, bookie_id)


async def _body(bk: BookKeeper, bookie_id: str, ledger_id: int, entry_id: int) -> bytes | None:
    response = await ask(bk.pool, bookie_id, ledger_id, entry_id, 5.0)
    if response.status is StatusCode.EIO:
        return None
    assert response.status is StatusCode.EOK, (bookie_id, entry_id, response.status)
    assert response.body is not None
    return response.body


def _good(body: bytes | None, ledger_id: int, entry_id: int) -> bool:
    if body is None:
        return False
    try:
        verified(body, Digester(DigestType.CRC32C), ledger_id, entry_id, "-")
    except DigestMismatchError:
        return False
    return True


async def _replacement_holds_good_copies(
    bk: BookKeeper, ledger_id: int, replacement: str, skip: int | None = None
) -> None:
    for entry_id in range(ENTRIES):
        if entry_id == skip:
            # Nothing written for it: the replacement says it has none (never a damaged copy).
            response = await ask(bk.pool, replacement, ledger_id, entry_id, 5.0)
            assert response.status is StatusCode.ENOENTRY, response.status
            continue
        body = await _body(bk, replacement, ledger_id, entry_id)
        assert _good(body, ledger_id, entry_id), entry_id


async def _replaced(bk: BookKeeper, ledger_id: int, lost: str) -> str:
    metadata = await bk.store.read_ledger(ledger_id)
    (fragment,) = metadata.fragments
    assert lost not in fragment.ensemble
    return fragment.ensemble[LOST_SLOT]


# ------------------------------------------------------------------ one good copy left


@pytest.mark.timeout(60)
async def test_a_copy_failing_its_digest_is_passed_over_for_a_good_one(
    cluster: Cluster, bk: BookKeeper
) -> None:
    ledger_id, metadata = await _ledger(cluster, mangle=1)
    bad, good = _sources(metadata, DAMAGED)
    bad_body = await _body(bk, bad, ledger_id, DAMAGED)
    good_body = await _body(bk, good, ledger_id, DAMAGED)
    assert not _good(bad_body, ledger_id, DAMAGED)  # served as stored: only the digest tells
    assert _good(good_body, ledger_id, DAMAGED)
    lost = metadata.fragments[0].ensemble[LOST_SLOT]
    await _lose(cluster, bk, lost)
    mark = await bk.store.autorecovery.mark(ledger_id, [lost], LOST_BOOKIE, 0)
    worker = _worker(bk)
    assert await worker.repair(mark) is Outcome.REPAIRED
    replacement = await _replaced(bk, ledger_id, lost)
    assert await _body(bk, replacement, ledger_id, DAMAGED) == good_body
    await _replacement_holds_good_copies(bk, ledger_id, replacement)
    assert worker.stats.entries_replicated == ENTRIES
    assert await _body(bk, bad, ledger_id, DAMAGED) == bad_body  # it was there all along
    assert await bk.store.autorecovery.read_mark(ledger_id) is None


@pytest.mark.timeout(60)
async def test_a_copy_damaged_on_disk_is_passed_over_for_a_good_one(
    cluster: Cluster, bk: BookKeeper
) -> None:
    ledger_id, metadata = await _ledger(cluster)
    bad_id, good = _sources(metadata, DAMAGED)
    bad = await _damage_on_disk(cluster, cluster.by_id(bad_id), ledger_id)
    assert await _body(bk, bad_id, ledger_id, DAMAGED) is None  # EIO
    good_body = await _body(bk, good, ledger_id, DAMAGED)
    assert _good(good_body, ledger_id, DAMAGED)
    lost = metadata.fragments[0].ensemble[LOST_SLOT]
    await _lose(cluster, bk, lost)
    mark = await bk.store.autorecovery.mark(ledger_id, [lost], LOST_BOOKIE, 0)
    damaged_reads = bad.stats.corrupt_reads
    worker = _worker(bk)
    assert await worker.repair(mark) is Outcome.REPAIRED
    assert bad.stats.corrupt_reads > damaged_reads  # the worker asked it first, met the damage
    replacement = await _replaced(bk, ledger_id, lost)
    assert await _body(bk, replacement, ledger_id, DAMAGED) == good_body
    await _replacement_holds_good_copies(bk, ledger_id, replacement)
    assert worker.stats.entries_replicated == ENTRIES


# ------------------------------------------------------------------ every copy damaged


@pytest.mark.timeout(60)
async def test_with_every_copy_failing_its_digest_the_entry_is_reported_lost_at_once(
    cluster: Cluster, bk: BookKeeper
) -> None:
    ledger_id, metadata = await _ledger(cluster, mangle=2)
    for source in _sources(metadata, DAMAGED):
        assert not _good(await _body(bk, source, ledger_id, DAMAGED), ledger_id, DAMAGED)
    lost = metadata.fragments[0].ensemble[LOST_SLOT]
    await _lose(cluster, bk, lost)
    mark = await bk.store.autorecovery.mark(ledger_id, [lost], LOST_BOOKIE, 0)
    worker = _worker(bk)
    assert await worker.repair(mark) is Outcome.REPORTED
    report = await bk.store.autorecovery.read_mark(ledger_id)
    assert report is not None
    assert (report.missing, report.lost) == ((), ((DAMAGED, DAMAGED),))
    replacement = await _replaced(bk, ledger_id, lost)
    await _replacement_holds_good_copies(bk, ledger_id, replacement, skip=DAMAGED)
    assert worker.stats.entries_replicated == ENTRIES - 1
    assert not await worker.run_once()  # a report is not work: not tried again
    status = await gather_status(bk.store)
    assert status.lost_ledgers == (LostLedger(ledger_id, ((DAMAGED, DAMAGED),)),)


@pytest.mark.timeout(60)
async def test_with_every_copy_damaged_on_disk_the_entry_is_reported_after_a_few_tries(
    cluster: Cluster, bk: BookKeeper
) -> None:
    """EIO may also come from a disk failing for a moment: the repair is tried again after its
    backoff, and once every attempt of ``DAMAGED_ATTEMPTS`` met only damaged copies of the
    entry it is reported lost (it used to be retried forever)."""
    ledger_id, metadata = await _ledger(cluster)
    for source in _sources(metadata, DAMAGED):
        await _damage_on_disk(cluster, cluster.by_id(source), ledger_id)
        assert await _body(bk, source, ledger_id, DAMAGED) is None  # EIO
    lost = metadata.fragments[0].ensemble[LOST_SLOT]
    await _lose(cluster, bk, lost)
    worker = _worker(bk)
    async with watching_marks(bk.store) as marks:
        await bk.store.autorecovery.mark(ledger_id, [lost], LOST_BOOKIE, 0)
        task = asyncio.get_running_loop().create_task(worker.run())
        try:
            found = await marks.until(lambda m: ledger_id in m and bool(m[ledger_id].lost), 20)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    report = found[ledger_id]
    assert (report.missing, report.lost) == ((), ((DAMAGED, DAMAGED),))
    assert worker.stats.repair_failures == DAMAGED_ATTEMPTS - 1
    replacement = await _replaced(bk, ledger_id, lost)
    await _replacement_holds_good_copies(bk, ledger_id, replacement, skip=DAMAGED)
    assert not await worker.run_once()  # reported: not tried again
