"""A bookie registers itself on start and deregisters on a clean stop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aiobk.bookie import Bookie, BookieConfig
from aiobk.metadata import open_store
from aiobk.protocol.errors import CookieError
from tests.support.names import unique_name
from tests.support.wait import wait_until


@pytest.mark.parametrize("kind", ["memory", "etcd"])
async def test_register_on_start_deregister_on_stop(tmp_path: Path, kind: str, request) -> None:
    if kind == "memory":
        uri = f"memory://{unique_name('reg')}"
    else:
        uri = request.getfixturevalue("etcd_server").uri(unique_name("reg"))
    store = open_store(uri)
    bookie = Bookie(BookieConfig(data_dir=str(tmp_path / "b"), port=0, metadata_uri=uri))
    await bookie.start()
    try:
        (info,) = await store.list_bookies()
        assert info.bookie_id == str(bookie.address)
        assert info.address == str(bookie.address)
        assert info.writable
        assert info.free_bytes > 0
        twin = Bookie(
            BookieConfig(
                data_dir=str(tmp_path / "twin"), port=0, metadata_uri=uri, bookie_id=info.bookie_id
            )
        )
        with pytest.raises(CookieError, match="journal_dirs"):  # refused by identity first
            await twin.start()
        assert not twin.running
    finally:
        await bookie.stop()
    assert await store.list_bookies() == []
    await store.close()


async def test_crashed_bookie_vanishes_after_its_ttl_and_lost_lease_reregisters(
    tmp_path: Path,
) -> None:
    uri = f"memory://{unique_name('crash')}"
    store = open_store(uri)
    config = BookieConfig(
        data_dir=str(tmp_path / "b"), port=0, metadata_uri=uri, registration_ttl=0.5
    )
    bookie = Bookie(config)
    await bookie.start()
    registration = bookie.registration
    assert registration is not None
    await store.kv.revoke_lease(registration.lease)  # the lease is lost behind its back

    def registered_again() -> bool:
        current = bookie.registration
        return current is not None and current is not registration and not current.lost.is_set()

    await wait_until(registered_again, timeout=10, what="registered again")
    assert [b.bookie_id for b in await store.list_bookies()] == [bookie.bookie_id]
    await bookie.crash()

    async def vanished() -> bool:
        return await store.list_bookies() == []

    await wait_until(vanished, timeout=10, what="the crashed bookie's lease expired")
    await store.close()


@pytest.mark.timeout(30)
async def test_a_bookie_whose_cookie_went_while_its_lease_was_lost_stays_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bookie paused past its lease (SIGSTOP, a partition) and decommissioned meanwhile --
    its cookie deleted -- must not register again when it wakes: clients would place new
    ledgers on a bookie the cluster let go. Its lease is revoked behind its back while the
    cookie is deleted; it stays out of the registry. The same with a cookie that names
    another instance (a replacement took the id)."""
    uri = f"memory://{unique_name('retired')}"
    store = open_store(uri)
    bookie = Bookie(BookieConfig(data_dir=str(tmp_path / "b"), port=0, metadata_uri=uri))
    await bookie.start()
    try:
        cookie = await store.read_cookie(bookie.bookie_id)
        assert cookie is not None
        await store.delete_cookie(bookie.bookie_id, cookie.version)
        registration = bookie.registration
        assert registration is not None
        await store.kv.revoke_lease(registration.lease)
        await wait_until(
            lambda: any("not registering again" in r.getMessage() for r in caplog.records),
            every=0.02,
            timeout=10,
            what="the bookie gave up registering again",
        )
        # An absence window: a registration under way when the error was logged is done by now.
        await asyncio.sleep(0.2)
        assert await store.list_bookies() == []
    finally:
        await bookie.stop()
        await store.close()
