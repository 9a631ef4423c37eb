"""Keys where BookKeeper requires them: the attacks a probe found, each against a
bookie process with a real etcd, and each now failing.

1. Squatting. Ledger ids are etcd revisions, so the next ones are easy to guess; fencing (or
   adding to) the next 200 ids with a junk key made the bookie create them with that key, and
   the next legitimate ledger's first append failed with ``UnauthorizedError``. Now a bookie
   creates a ledger it does not hold only if the metadata has it, with the digest of the key
   the request carries: ids not created yet are ENOLEDGER, an existing one with a junk key EUA,
   and the rightful writer's first append succeeds.
2. A forged RECOVERY_ADD. The empty password's master key is a public constant; a
   RECOVERY_ADD with it replaced entry 0 of a closed ledger, and readers served the forgery
   (CRC32C is no MAC). Now an entry held is never replaced: different bytes are refused.
3. FORCE with an empty key was accepted. Now the key is required, and must be the ledger's.

Beside them: a store that cannot be reached gives EIO and creates nothing; a flood of adds for
unknown ids is bounded and an honest writer on another connection keeps working; adds
pipelined into a ledger the bookie does not hold yet keep their order; a ledger whose metadata
was written before ledgers had a salt keeps working.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess, open_store
from aiobk.protocol import (
    AddFlag,
    AddRequest,
    Durability,
    ForceRequest,
    ForceResponse,
    ReadFlag,
    ReadRequest,
    ReadResponse,
    StatusCode,
    master_key,
)
from aiobk.protocol.errors import UnauthorizedError
from aiobk.protocol.keys import legacy_password_digest
from tests.hostile.conftest import Connect, Launch
from tests.hostile.honest import add_request, entry_body
from tests.hostile.rawclient import RawConnection
from tests.support.names import unique_name
from tests.support.procs import stopped

JUNK = master_key(b"squatter")
PUBLIC = master_key(b"")  # the empty password's key: anyone can compute it


async def _statuses(
    conn: RawConnection, requests: list[AddRequest | ReadRequest]
) -> Counter[StatusCode]:
    txns = conn.send_many(requests)
    answers = await conn.wait_for(txns, 60)
    return Counter(answer.status for answer in answers.values())


@pytest.mark.timeout(120)
async def test_squatting_the_next_ledger_ids_fails(
    launch: Launch, connect: Connect, etcd_server: EtcdProcess
) -> None:
    uri = etcd_server.uri(unique_name("squat"))
    bookie = await launch(args=("--metadata", uri))
    async with BookKeeper(uri) as bk:
        seen = await bk.create_ledger(1, 1, 1, password=b"pw")  # what an attacker sees
        conn = await connect(bookie)
        ids = range(seen.ledger_id + 1, seen.ledger_id + 201)
        fences = [ReadRequest(conn.next_txn_id(), i, -1, ReadFlag.FENCE, JUNK) for i in ids]
        adds = [add_request(conn.next_txn_id(), i, 0, b"mine", key=JUNK) for i in ids]
        recovery_adds = [
            AddRequest(
                conn.next_txn_id(), i, 0, AddFlag.RECOVERY_ADD, master_key=JUNK,
                body=entry_body(i, 0, b"mine"),
            )
            for i in ids
        ]  # fmt: skip
        told = await _statuses(conn, [*fences, *adds, *recovery_adds])
        # Not in the metadata: ENOLEDGER; past the lookups one connection may hold at once:
        # ETOOMANYREQUESTS. Never EOK.
        assert set(told) <= {StatusCode.ENOLEDGER, StatusCode.ETOOMANYREQUESTS}, told
        assert told[StatusCode.ENOLEDGER] > 0, told
        stats = await bookie.stats()
        assert stats["ledgers_held"] == 0, stats  # nothing was created
        assert stats["key_check_refused_absent"] == told[StatusCode.ENOLEDGER], stats

        # The rightful writers: one whose id the squatter fenced before it existed...
        handle = await bk.create_ledger(1, 1, 1, password=b"pw")
        assert handle.ledger_id in ids  # the squatter guessed right
        assert await handle.append(b"first") == 0
        # ... and one the squatter fences once it exists, before its first append: EUA.
        other = await bk.create_ledger(1, 1, 1, password=b"pw")
        fence = await conn.call(
            ReadRequest(conn.next_txn_id(), other.ledger_id, -1, ReadFlag.FENCE, JUNK)
        )
        assert fence.status is StatusCode.EUA, fence
        add = await conn.call(add_request(conn.next_txn_id(), other.ledger_id, 0, b"x", key=JUNK))
        assert add.status is StatusCode.EUA, add
        assert await other.append(b"first") == 0
        assert await other.append(b"second") == 1
        await handle.close()
        await other.close()
        reader = await bk.open_ledger(other.ledger_id, b"pw")
        assert [e.data for e in await reader.read(0, 1)] == [b"first", b"second"]
        stats = await bookie.stats()
        assert stats["key_check_refused_key"] == 2, stats
        assert stats["auth_failures"] >= 2, stats
    assert bookie.terminate() == 0, bookie.log_text()


@pytest.mark.timeout(120)
async def test_a_forged_recovery_add_cannot_replace_an_entry(
    launch: Launch, connect: Connect, etcd_server: EtcdProcess
) -> None:
    uri = etcd_server.uri(unique_name("forge"))
    bookie = await launch(args=("--metadata", uri))
    async with BookKeeper(uri) as bk:
        handle = await bk.create_ledger(1, 1, 1)  # the default, empty password
        assert await handle.append(b"original") == 0
        assert await handle.append(b"second") == 1
        await handle.close()
        ledger = handle.ledger_id
        conn = await connect(bookie)

        forged = AddRequest(
            conn.next_txn_id(), ledger, 0, AddFlag.RECOVERY_ADD, master_key=PUBLIC,
            body=entry_body(ledger, 0, b"forged!!"),
        )  # fmt: skip
        assert (await conn.call(forged)).status is StatusCode.EBADREQ
        # A writer-closed ledger is not fenced: a plain add with the public key, too.
        plain = add_request(conn.next_txn_id(), ledger, 0, b"forged!!", key=PUBLIC)
        assert (await conn.call(plain)).status is StatusCode.EBADREQ
        # Recovery's write-back of the same entry (its LAC frozen, so other bytes): taken.
        again = AddRequest(
            conn.next_txn_id(), ledger, 0, AddFlag.RECOVERY_ADD, master_key=PUBLIC,
            body=entry_body(ledger, 0, b"original", lac=-1),
        )  # fmt: skip
        assert (await conn.call(again)).status is StatusCode.EOK

        raw = await conn.call(ReadRequest(conn.next_txn_id(), ledger, 0))
        assert isinstance(raw, ReadResponse)
        assert raw.body is not None
        assert raw.body.endswith(b"original")
        reader = await bk.open_ledger(ledger)
        assert [e.data for e in await reader.read(0, 1)] == [b"original", b"second"]
        stats = await bookie.stats()
        assert stats["key_check_rewrites_refused"] == 2, stats
    assert bookie.terminate() == 0, bookie.log_text()
    assert bookie.log_text().count("bytes unlike the copy held") == 1  # logged once


@pytest.mark.timeout(120)
async def test_force_needs_the_ledgers_key(
    launch: Launch, connect: Connect, etcd_server: EtcdProcess
) -> None:
    uri = etcd_server.uri(unique_name("force"))
    bookie = await launch(args=("--metadata", uri))
    async with BookKeeper(uri) as bk:
        handle = await bk.create_ledger(1, 1, 1, password=b"pw", durability=Durability.VOLATILE)
        await handle.append(b"x")
        conn = await connect(bookie)
        for key in (b"", master_key(b"wrong"), PUBLIC):
            told = await conn.call(ForceRequest(conn.next_txn_id(), handle.ledger_id, key))
            assert told.status is StatusCode.EUA, (key, told)
        right = await conn.call(
            ForceRequest(conn.next_txn_id(), handle.ledger_id, master_key(b"pw"))
        )
        assert right.status is StatusCode.EOK, right
        assert await handle.force() == 0  # the client sends the key
        await handle.close()
    assert bookie.terminate() == 0, bookie.log_text()


@pytest.mark.timeout(120)
async def test_a_force_right_behind_a_new_ledgers_first_adds_covers_them(
    launch: Launch, connect: Connect, etcd_server: EtcdProcess
) -> None:
    """The first adds of a ledger wait while the bookie looks it up in the metadata; a FORCE
    sent right behind them waits with them instead of finding no ledger (ENOLEDGER)."""
    uri = etcd_server.uri(unique_name("forcefirst"))
    bookie = await launch(args=("--metadata", uri))
    async with BookKeeper(uri) as bk:
        key = master_key(b"pw")
        for _round in range(5):
            handle = await bk.create_ledger(1, 1, 1, password=b"pw", durability=Durability.VOLATILE)
            conn = await connect(bookie)
            requests = [
                add_request(conn.next_txn_id(), handle.ledger_id, 0, b"a", key=key),
                add_request(conn.next_txn_id(), handle.ledger_id, 1, b"b", key=key),
                ForceRequest(conn.next_txn_id(), handle.ledger_id, key),
            ]
            answers = await conn.wait_for(conn.send_many(requests), 30)
            force = answers[requests[2].txn_id]
            assert [answers[r.txn_id].status for r in requests] == [StatusCode.EOK] * 3, answers
            assert isinstance(force, ForceResponse)
            assert force.last_add_synced == 1, force
            junk = ForceRequest(conn.next_txn_id(), handle.ledger_id + 10_000, key)
            assert (await conn.call(junk)).status is StatusCode.ENOLEDGER  # none: none waits
    assert bookie.terminate() == 0, bookie.log_text()


@pytest.mark.timeout(120)
async def test_an_unreachable_store_gives_eio_and_creates_nothing(
    launch: Launch, connect: Connect, tmp_path: Path
) -> None:
    etcd = EtcdProcess(data_dir=str(tmp_path / "etcd")).start()
    try:
        uri = etcd.uri(unique_name("down"))
        bookie = await launch(args=("--metadata", uri))
        async with BookKeeper(uri) as bk:
            handle = await bk.create_ledger(1, 1, 1, password=b"pw")
            conn = await connect(bookie)
            assert etcd.pid is not None
            os.kill(etcd.pid, signal.SIGSTOP)  # unreachable: every call times out
            try:
                await stopped(etcd.pid)  # its running threads may answer a little longer
                started = time.monotonic()
                add = add_request(
                    conn.next_txn_id(), handle.ledger_id, 0, b"x", key=master_key(b"pw")
                )
                fence = ReadRequest(
                    conn.next_txn_id(), handle.ledger_id + 1, -1, ReadFlag.FENCE, JUNK
                )
                told = await conn.wait_for(conn.send_many([add, fence]), 30)
                waited = time.monotonic() - started
            finally:
                os.kill(etcd.pid, signal.SIGCONT)
            assert {t.status for t in told.values()} == {StatusCode.EIO}, told
            assert waited < 15, waited
            stats = await bookie.stats()
            assert stats["ledgers_held"] == 0, stats
            assert stats["key_check_lookup_failures"] >= 1, stats
            # Back: the writer's append lands.
            async with asyncio.timeout(60):
                assert await handle.append(b"after") == 0
            await handle.close()
        assert bookie.terminate() == 0, bookie.log_text()
    finally:
        etcd.stop()


@pytest.mark.timeout(180)
async def test_a_flood_of_unknown_ids_is_bounded_and_honest_writers_go_on(
    launch: Launch, connect: Connect, etcd_server: EtcdProcess
) -> None:
    uri = etcd_server.uri(unique_name("flood"))
    bookie = await launch(args=("--metadata", uri))
    async with BookKeeper(uri) as bk:
        honest = await bk.create_ledger(1, 1, 1, password=b"pw")
        await honest.append(b"warm")
        conns = [await connect(bookie) for _ in range(4)]
        base = 1 << 40  # ids nobody will create
        sent: dict[RawConnection, list[int]] = {conn: [] for conn in conns}
        latencies: list[float] = []
        for round_ in range(5):
            for index, conn in enumerate(conns):
                first = base + (round_ * len(conns) + index) * 2000
                sent[conn] += conn.send_many(
                    add_request(conn.next_txn_id(), first + i, 0, b"f" * 512, key=JUNK)
                    for i in range(2000)
                )
            started = time.monotonic()
            await honest.append(b"honest %d" % round_)
            latencies.append(time.monotonic() - started)
            # A new ledger's first append needs a lookup of its own: it gets one.
            fresh = await bk.create_ledger(1, 1, 1, password=b"pw")
            started = time.monotonic()
            assert await fresh.append(b"new") == 0
            latencies.append(time.monotonic() - started)
            await fresh.close()
        flood = sum(len(txns) for txns in sent.values())
        answered: Counter[StatusCode] = Counter()
        for conn, txns in sent.items():
            done = await conn.wait_for(txns, 120)
            answered.update(r.status for r in done.values())
        assert sum(answered.values()) == flood
        assert set(answered) <= {StatusCode.ENOLEDGER, StatusCode.ETOOMANYREQUESTS}, answered
        assert answered[StatusCode.ETOOMANYREQUESTS] > 0, answered  # the bound was met
        assert max(latencies) < 5.0, latencies
        stats = await bookie.stats()
        assert stats["ledgers_held"] == 6, stats  # the honest ledgers, nothing of the flood
        assert stats["key_check_lookups"] + stats["key_check_refused_busy"] >= flood, stats
        await honest.close()
    assert bookie.terminate() == 0, bookie.log_text()


@pytest.mark.timeout(120)
async def test_adds_into_a_ledger_not_held_yet_keep_their_order(
    launch: Launch, connect: Connect, etcd_server: EtcdProcess
) -> None:
    """Every add below waits for the one lookup of its ledger; they reach the journal in the
    order they came, so their acknowledgements (after one fdatasync each batch, in journal
    order) come back in that order too."""
    uri = etcd_server.uri(unique_name("order"))
    bookie = await launch(args=("--metadata", uri))
    async with BookKeeper(uri) as bk:
        handle = await bk.create_ledger(1, 1, 1, password=b"pw")
        ledger = handle.ledger_id
        key = master_key(b"pw")
        conn = await connect(bookie)
        txns = conn.send_many(
            add_request(conn.next_txn_id(), ledger, i, b"entry %d" % i, key=key, lac=i - 1)
            for i in range(300)
        )
        told = await conn.wait_for(txns, 60)
        assert all(t.status is StatusCode.EOK for t in told.values()), told
        assert [txn for txn in conn.received if txn in told] == txns
        for i in (0, 150, 299):
            read = await conn.call(ReadRequest(conn.next_txn_id(), ledger, i))
            assert isinstance(read, ReadResponse)
            assert read.body is not None
            assert read.body.endswith(b"entry %d" % i)
        stats = await bookie.stats()
        assert stats["key_check_lookups"] == 1, stats
    assert bookie.terminate() == 0, bookie.log_text()


@pytest.mark.timeout(120)
async def test_a_ledger_with_metadata_from_before_the_salt_keeps_working(
    launch: Launch, connect: Connect, etcd_server: EtcdProcess
) -> None:
    """Metadata written before ledgers had a salt keeps the unsalted digest of the password: the
    client checks a password against it; a bookie, holding only the key, checks that the ledger
    exists (docs/operations/security.md)."""
    uri = etcd_server.uri(unique_name("legacy"))
    bookie = await launch(args=("--metadata", uri))
    store = open_store(uri)
    async with BookKeeper(uri) as bk:
        handle = await bk.create_ledger(1, 1, 1, password=b"pw")
        ledger = handle.ledger_id
        current = await store.read_ledger(ledger)
        legacy = current.replace(password_salt=b"", password_digest=legacy_password_digest(b"pw"))
        await store.write_ledger(ledger, legacy)  # the writer's close re-reads and retries
        assert await handle.append(b"old") == 0
        await handle.close()
        with pytest.raises(UnauthorizedError):
            await bk.open_ledger(ledger, b"wrong")
        reader = await bk.open_ledger(ledger, b"pw")
        assert [e.data for e in await reader.read(0, 0)] == [b"old"]
        with pytest.raises(UnauthorizedError):
            await bk.delete_ledger(ledger, b"wrong")
        await bk.delete_ledger(ledger, b"pw")
    await store.close()
    assert bookie.terminate() == 0, bookie.log_text()
