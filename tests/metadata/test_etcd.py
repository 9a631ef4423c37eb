"""What only a real etcd can show: concurrency across clients, an outage, failover."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.metadata import EtcdProcess, Fragment, LedgerMetadata, free_port, open_store
from aiobk.metadata.kv_etcd import EtcdKV
from aiobk.protocol.errors import MetadataStoreError, MetadataVersionError
from tests.support.names import unique_name
from tests.support.wait import wait_until

ENSEMBLE = ("a:1", "b:2", "c:3")


@pytest.mark.timeout(180)
async def test_eight_clients_allocating_concurrently_never_share_an_id(etcd_server) -> None:
    prefix = unique_name("ids")
    stores = [open_store(etcd_server.uri(prefix)) for _ in range(8)]
    try:
        batches = await asyncio.gather(
            *(asyncio.gather(*(s.allocate_ledger_id() for _ in range(500))) for s in stores)
        )
    finally:
        for s in stores:
            await s.close()
    ids = [i for batch in batches for i in batch]
    assert len(ids) == 4000
    assert len(set(ids)) == 4000


async def test_two_writers_racing_exactly_one_wins_per_version(etcd_server) -> None:
    prefix = unique_name("race")
    first, second = open_store(etcd_server.uri(prefix)), open_store(etcd_server.uri(prefix))
    try:
        ledger_id = await first.allocate_ledger_id()
        await first.create_ledger(ledger_id, LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),)))
        for round_ in range(30):
            seen_a = await first.read_ledger(ledger_id)
            seen_b = await second.read_ledger(ledger_id)
            assert seen_a.version == seen_b.version
            results = await asyncio.gather(
                first.write_ledger(ledger_id, seen_a.replace(length=2 * round_)),
                second.write_ledger(ledger_id, seen_b.replace(length=2 * round_ + 1)),
                return_exceptions=True,
            )
            wins = [r for r in results if isinstance(r, LedgerMetadata)]
            losses = [r for r in results if isinstance(r, MetadataVersionError)]
            assert (len(wins), len(losses)) == (1, 1), results
            assert (await first.read_ledger(ledger_id)).length == wins[0].length
    finally:
        await first.close()
        await second.close()


async def test_unreachable_etcd_is_a_typed_error_within_the_timeout() -> None:
    store = open_store(f"etcd://127.0.0.1:{free_port()}/x", timeout=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(MetadataStoreError, match=r"unreachable|did not answer"):
        await store.read_ledger(1)
    assert loop.time() - started < 3.0
    await store.close()


async def test_a_dead_endpoint_fails_over_to_a_live_one(etcd_server) -> None:
    uri = f"etcd://127.0.0.1:{free_port()},{etcd_server.endpoint}/{unique_name('fo')}"
    store = open_store(uri, timeout=2.0)
    try:
        ledger_id = await store.allocate_ledger_id()
        created = await store.create_ledger(
            ledger_id, LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),))
        )
        assert (await store.read_ledger(ledger_id)) == created
    finally:
        await store.close()


@pytest.mark.timeout(120)
async def test_etcd_restart_errors_then_reconnects_and_watches_resume(tmp_path) -> None:
    server = EtcdProcess(data_dir=str(tmp_path / "etcd")).start()
    store = open_store(server.uri("restart"), timeout=1.0)
    try:
        ledger_id = await store.allocate_ledger_id()
        created = await store.create_ledger(
            ledger_id, LedgerMetadata(3, 3, 2, (Fragment(0, ENSEMBLE),))
        )
        updates = store.watch_ledger(ledger_id)
        assert await asyncio.wait_for(anext(updates), 10) == created

        await asyncio.to_thread(server.stop, False)  # keep the data: a restart, not a loss
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(MetadataStoreError):
            await store.read_ledger(ledger_id)
        assert loop.time() - started < 3.0, "an outage must be reported, not hang"

        await asyncio.to_thread(server.start)
        current: LedgerMetadata | None = None

        async def answers() -> bool:
            nonlocal current
            try:
                current = await store.read_ledger(ledger_id)
            except MetadataStoreError:
                return False
            return True

        # gRPC reconnects on its own; give it a moment.
        await wait_until(answers, every=0.1, timeout=60, what="the restarted etcd answers")
        assert current == created
        await store.write_ledger(ledger_id, current.in_recovery())
        seen = await asyncio.wait_for(anext(updates), 20)
        assert seen is not None
        assert seen.state.value == "IN_RECOVERY"
        await updates.aclose()
    finally:
        await store.close()
        server.stop()


async def test_a_cancel_arriving_as_a_call_completes_is_not_swallowed(etcd_server) -> None:
    """Python 3.11's wait_for returns the result when the caller is cancelled in the same loop
    turn as the call completes, so a cancelled task carries on. A bookie's lease keep-alive did
    exactly that and ``Registration.close()`` waited for it forever (a hung ``make test``)."""
    store = open_store(etcd_server.uri(unique_name("cancel")))
    kv = store.kv
    assert isinstance(kv, EtcdKV)
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[int] = loop.create_future()
    waiting = asyncio.Event()

    async def call(_client: object) -> int:
        waiting.set()
        return await reply

    try:
        task = asyncio.ensure_future(kv._call("test call", call))
        await asyncio.wait_for(waiting.wait(), 10)  # the client connected; the call waits
        reply.set_result(1)
        task.cancel()  # same loop turn: the caller asked to stop, it must stop
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await store.close()


async def test_a_call_whose_client_is_closed_under_it_is_tried_again_not_cancelled(
    etcd_server: EtcdProcess,
) -> None:
    """gRPC cancels the calls of a channel closed under them. That is not a cancellation of
    the caller: a bookie's lease keep-alive and GC loop ended silently this way when another
    call moved to the next etcd endpoint, and the bookie dropped out of the registry."""
    kv = EtcdKV([(etcd_server.host, etcd_server.client_port)], timeout=3.0)
    try:
        lease, _ttl = await kv.grant_lease(30)
        for turn in range(20):
            calls = [asyncio.ensure_future(kv.keep_alive(lease)) for _ in range(4)]
            await asyncio.sleep(0.0005 * (turn % 5))  # deliberate jitter: some sent, some not yet
            client = kv._clients._client
            if turn % 2:
                await kv._clients.rotate()  # as a failed call does: to the next endpoint
            else:
                await kv._clients.close_client(client)  # as a token's retirement does, later
            assert [await call > 0 for call in calls] == [True] * 4
    finally:
        await kv.close()


async def test_a_call_on_a_closed_kv_is_an_error_not_a_new_connection(
    etcd_server: EtcdProcess,
) -> None:
    kv = EtcdKV([(etcd_server.host, etcd_server.client_port)], timeout=3.0)
    lease, _ttl = await kv.grant_lease(30)
    call = asyncio.ensure_future(kv.keep_alive(lease))
    await asyncio.sleep(0)
    await kv.close()
    (outcome,) = await asyncio.gather(call, return_exceptions=True)
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, MetadataStoreError)
        assert "closed" in str(outcome)
    assert kv._clients._client is None
