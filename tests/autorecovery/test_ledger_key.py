"""LEDGER_KEY (bookie.ops.ledger_key): a ledger's master key only for a peer that proves the
cluster's secret; a peer that reaches only the bookie port gets EUA, and a flood of such
requests costs the metadata store one read per few seconds."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookieConnection, BookKeeper
from aiobk.metadata import MetadataStore
from aiobk.protocol import (
    LedgerKeyRequest,
    LedgerKeyResponse,
    StatusCode,
    key_request_proof,
    master_key,
)
from tests.support.cluster import Cluster, forget, start_cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(tmp_path, 3, autorecovery_enabled=False)
    yield cluster
    await cluster.stop()
    forget(cluster)


async def _ask(conn: BookieConnection, ledger_id: int, proof: bytes) -> LedgerKeyResponse:
    response = await conn.send(LedgerKeyRequest(conn.next_txn_id(), ledger_id, proof), 5.0)
    assert isinstance(response, LedgerKeyResponse)
    return response


@pytest.mark.timeout(30)
async def test_the_key_goes_only_to_a_peer_that_proves_the_secret(cluster: Cluster) -> None:
    async with BookKeeper(cluster.uri) as bk:
        lh = await bk.create_ledger(password=b"pw")
        await lh.append(b"x")
        bookie = cluster.by_id(lh.metadata.fragments[0].ensemble[0])
        conn = await BookieConnection.open("127.0.0.1", bookie.address.port)
        try:
            # No secret made yet: nobody can prove it.
            assert (await _ask(conn, lh.ledger_id, b"\0" * 32)).status is StatusCode.EUA
            store: MetadataStore = bk.store
            secret = await store.autorecovery.cluster_secret(random.Random(3).randbytes)
            assert secret is not None
            bookie.secret.recheck_at = 0.0  # as if the recheck interval had passed
            wrong = key_request_proof(secret + b"x", lh.ledger_id)
            assert (await _ask(conn, lh.ledger_id, wrong)).status is StatusCode.EUA
            other = key_request_proof(secret, lh.ledger_id + 1)  # proof for another ledger
            assert (await _ask(conn, lh.ledger_id, other)).status is StatusCode.EUA
            right = await _ask(conn, lh.ledger_id, key_request_proof(secret, lh.ledger_id))
            assert right.status is StatusCode.EOK
            assert right.master_key == master_key(b"pw")
            unknown = await _ask(conn, 999_999, key_request_proof(secret, 999_999))
            assert unknown.status is StatusCode.ENOLEDGER
            assert bookie.stats.auth_failures >= 3
        finally:
            conn.close()


@pytest.mark.timeout(30)
async def test_a_flood_of_key_requests_without_a_secret_reads_the_store_once(
    cluster: Cluster,
) -> None:
    bookie = cluster.bookies[0]
    store = bookie._metadata
    assert store is not None
    reads = 0
    real_get = store.kv.get

    async def counting_get(key: bytes):  # type: ignore[no-untyped-def]
        nonlocal reads
        if key == store.keys.cluster_secret:
            reads += 1
        return await real_get(key)

    store.kv.get = counting_get  # type: ignore[method-assign]
    conn = await BookieConnection.open("127.0.0.1", bookie.address.port)
    try:
        for ledger_id in range(500):
            assert (await _ask(conn, ledger_id, b"")).status is StatusCode.EUA
    finally:
        conn.close()
        store.kv.get = real_get  # type: ignore[method-assign]
    assert reads == 1


@pytest.mark.timeout(30)
async def test_key_requests_racing_the_first_read_of_the_secret_all_get_it(
    cluster: Cluster,
) -> None:
    """The first request reads the secret from the store; one arriving meanwhile waits for that
    read instead of seeing no secret (it used to get EUA)."""
    async with BookKeeper(cluster.uri) as bk:
        lh = await bk.create_ledger()
        await lh.append(b"x")
        secret = await bk.store.autorecovery.cluster_secret(random.Random(4).randbytes)
        assert secret is not None
        bookie = cluster.by_id(lh.metadata.fragments[0].ensemble[0])
        store = bookie._metadata
        assert store is not None
        real_get = store.kv.get

        async def slow_get(key: bytes):  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.05)  # a store over a network: the read takes a while
            return await real_get(key)

        store.kv.get = slow_get  # type: ignore[method-assign]
        conn = await BookieConnection.open("127.0.0.1", bookie.address.port)
        proof = key_request_proof(secret, lh.ledger_id)
        try:
            answers = await asyncio.gather(*(_ask(conn, lh.ledger_id, proof) for _ in range(5)))
        finally:
            conn.close()
            store.kv.get = real_get  # type: ignore[method-assign]
        assert [a.status for a in answers] == [StatusCode.EOK] * 5
