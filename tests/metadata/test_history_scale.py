"""etcd at scale: every allocation, creation and deletion of a ledger is an etcd
revision, and etcd keeps every revision until compacted -- then refuses all writes at its quota.
100,000 ledgers allocated, created and deleted on a real etcd, with the store compacting its
history as each bookie's GC pass does: the database stops growing. Also measures the metadata
bytes one ledger costs in etcd (open, closed, after two ensemble changes), and what 10,000
ledgers add to etcd's database file once compacted and defragmented."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiobk.metadata import EtcdProcess, Fragment, LedgerMetadata, MetadataStore, open_store
from aiobk.metadata.kv_etcd import EtcdKV
from aiobk.protocol.keys import SALT_SIZE, key_digest, master_key

ENSEMBLE = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
ROUNDS = 10
PER_ROUND = 10_000
KEEP = 10_000  # revisions of history kept at each compaction
CONCURRENCY = 64


async def _churn(store: MetadataStore, count: int) -> None:
    """``count`` ledgers allocated, created and deleted (three revisions each)."""
    metadata = LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),))
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with gate:
            ledger_id = await store.allocate_ledger_id()
            await store.create_ledger(ledger_id, metadata)
            await store.delete_ledger(ledger_id)

    await asyncio.gather(*(one() for _ in range(count)))


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    # No --auto-compaction here: what bounds the history is the store's own compaction.
    server = EtcdProcess(data_dir=str(tmp_path / "etcd")).start()
    yield server
    server.stop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("per_round", "keep"),
    [
        # 100,000 ledgers: about two minutes, so in `make soak`, not `make test`.
        pytest.param(PER_ROUND, KEEP, marks=pytest.mark.soak, id="100000"),
        pytest.param(2_000, 2_000, id="20000"),
    ],
)
async def test_ledgers_churned_leave_the_etcd_database_bounded(
    etcd: EtcdProcess, capsys: pytest.CaptureFixture[str], per_round: int, keep: int
) -> None:
    """ROUNDS rounds of ``per_round`` ledgers allocated, created and deleted, etcd's history
    compacted behind ``keep`` revisions after each: the database file stops growing."""
    store = open_store(etcd.uri("scale"))
    kv = store.kv
    assert isinstance(kv, EtcdKV)
    sizes = []
    try:
        for _ in range(ROUNDS):
            await _churn(store, per_round)
            assert await store.compact_history(keep=keep) > 0
            sizes.append(await kv.db_size())
    finally:
        await store.close()
    with capsys.disabled():
        print(f"\netcd database after each {per_round:,} ledgers churned, compacted: {sizes}")
    # Without compaction each round adds its 3 x per_round revisions (the file grows ~6 MB a
    # round of 10,000, 60 MB in all); with it, freed pages are reused and the file stops
    # growing early.
    assert max(sizes[ROUNDS // 2 :]) <= 1.25 * sizes[2], sizes


def _as_a_client_writes_it(rng: random.Random) -> LedgerMetadata:
    """An open three-bookie ledger's metadata as ``BookKeeper.create_ledger`` stores it: a
    salted digest of the master key, its salt, the creation time."""
    salt = rng.randbytes(SALT_SIZE)
    return LedgerMetadata(
        3,
        3,
        2,
        (Fragment(0, ENSEMBLE),),
        password_digest=key_digest(salt, master_key(b"a password")),
        custom_metadata={},
        creation_time=int(time.time() * 1000),
        password_salt=salt,
    )


def _closed(metadata: LedgerMetadata, last_entry_id: int = 99_999) -> LedgerMetadata:
    return metadata.closed(last_entry_id, (last_entry_id + 1) * 100)


def _two_ensemble_changes(metadata: LedgerMetadata) -> LedgerMetadata:
    """Closed after two bookies were replaced, one at a time (three fragments)."""
    first = metadata.with_fragment(31_337, (ENSEMBLE[0], ENSEMBLE[1], "127.0.0.1:3184"))
    second = first.with_fragment(65_536, (ENSEMBLE[0], "127.0.0.1:3185", "127.0.0.1:3184"))
    return _closed(second)


SHAPES = {
    "open": lambda metadata: metadata,
    "closed": _closed,
    "closed, two ensemble changes": _two_ensemble_changes,
}


@pytest.mark.timeout(60)
async def test_what_a_ledger_costs_in_etcd(
    etcd: EtcdProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """Metadata bytes per ledger (key and JSON value), 100 ledgers of each shape, as stored:
    open (just created), closed, and closed after two ensemble changes."""
    store = open_store(etcd.uri("cost"))
    rng = random.Random(15)
    figures: dict[str, float] = {}
    try:
        for shape, make in SHAPES.items():
            stored: dict[int, LedgerMetadata] = {}
            for _ in range(100):
                ledger_id = await store.allocate_ledger_id()
                created = await store.create_ledger(ledger_id, _as_a_client_writes_it(rng))
                final = make(created)
                if final != created:  # written over, as the client closes or changes it
                    await store.write_ledger(ledger_id, final)
                stored[ledger_id] = final
            found = []
            for ledger_id, final in stored.items():
                item, _revision = await store.kv.get(store.keys.ledger(ledger_id))
                assert item is not None
                assert LedgerMetadata.from_json(item.value) == final  # the shape asked for
                found.append(item)
            figures[shape] = sum(len(kv.key) + len(kv.value) for kv in found) / len(found)
    finally:
        await store.close()
    with capsys.disabled():
        for shape, size in figures.items():
            print(f"\nmetadata bytes per ledger in etcd, {shape}: {size:.0f}")
    assert figures["open"] < figures["closed"] < figures["closed, two ensemble changes"]
    assert all(200 < size < 1024 for size in figures.values()), figures
    # Each ensemble change adds one fragment: three quoted bookie ids, its first entry id and
    # the JSON around them (~40 bytes), nothing more.
    per_change = (figures["closed, two ensemble changes"] - figures["closed"]) / 2
    assert per_change <= 3 * (len(ENSEMBLE[0]) + 3) + 48, figures


FILE_LEDGERS = 10_000


def _db_file(etcd: EtcdProcess) -> str:
    assert etcd.data_dir is not None
    return os.path.join(etcd.data_dir, "member-data", "member", "snap", "db")


async def _compacted_and_defragmented(etcd: EtcdProcess, store: MetadataStore) -> tuple[int, int]:
    """History compacted to now and the file defragmented: (etcd's database size, the file's
    size on disk). What is left is what the keys themselves take."""
    _found, revision = await store.kv.get(store.keys.idgen)
    await store.kv.compact(revision)
    await asyncio.to_thread(etcd.gateway.post, "/v3/maintenance/defragment", {}, timeout=60.0)
    kv = store.kv
    assert isinstance(kv, EtcdKV)
    return await kv.db_size(), os.path.getsize(_db_file(etcd))


@pytest.mark.timeout(120)
async def test_what_10000_ledgers_cost_in_etcds_database_file(
    etcd: EtcdProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a ledger costs etcd's database file once history is compacted and the file
    defragmented: 10,000 closed ledgers (made as a client makes them, id allocated then
    metadata stored; stored closed at once, since only the last value of a key is left after
    compaction). The growth of the file per ledger, next to its key and value bytes."""
    store = open_store(etcd.uri("file"))
    rng = random.Random(10_000)
    metadata = [_closed(_as_a_client_writes_it(rng)) for _ in range(FILE_LEDGERS)]
    raw = 0
    try:
        before, before_file = await _compacted_and_defragmented(etcd, store)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(value: LedgerMetadata) -> int:
            async with gate:
                ledger_id = await store.allocate_ledger_id()
                await store.create_ledger(ledger_id, value)
                return len(store.keys.ledger(ledger_id)) + len(value.to_json())

        raw = sum(await asyncio.gather(*(one(value) for value in metadata)))
        after, after_file = await _compacted_and_defragmented(etcd, store)
    finally:
        await store.close()
    per_ledger = (after - before) / FILE_LEDGERS
    per_ledger_file = (after_file - before_file) / FILE_LEDGERS
    key_and_value = raw / FILE_LEDGERS
    with capsys.disabled():
        print(
            f"\netcd database, compacted and defragmented: {before:,} B empty, {after:,} B "
            f"with {FILE_LEDGERS:,} closed ledgers (file on disk {before_file:,} -> "
            f"{after_file:,} B): {per_ledger:.0f} B per ledger ({per_ledger_file:.0f} B on "
            f"disk) for {key_and_value:.0f} B of key and value, "
            f"x{per_ledger / key_and_value:.2f}; {per_ledger * FILE_LEDGERS / 2**20:.1f} MiB "
            f"per 10,000 ledgers, {per_ledger * 1_000_000 / 2**30:.2f} GiB per million "
            "(etcd's default quota: 2 GiB)"
        )
    # The file holds every key and value (nothing is compressed), with bbolt's pages, the
    # revision keys and the protobuf framing around them: more, but not many times more.
    assert key_and_value <= per_ledger <= 2.5 * key_and_value, (per_ledger, key_and_value)
    assert per_ledger_file <= 2.5 * key_and_value, (per_ledger_file, key_and_value)
    # A million closed ledgers stay well inside etcd's default 2 GiB quota.
    assert per_ledger * 1_000_000 < 2**30, per_ledger
