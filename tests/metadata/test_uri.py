"""Metadata URIs with credentials: ``etcd://USER:PASSWORD@HOST:PORT/PREFIX`` works
against an etcd with auth enabled, and the password is printed nowhere (errors, reprs, the
store's ``uri``); it was echoed in a hostname-lookup error."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import aetcd
import pytest
from aetcd import rpc

from aiobk.bookie import Bookie, BookieConfig
from aiobk.metadata import EtcdProcess, Fragment, LedgerMetadata, MetadataURIError, open_store
from aiobk.metadata.uri import EtcdCredentials, parse_etcd_uri, redact_uri
from aiobk.protocol.errors import MetadataStoreError
from tests.support.names import unique_name
from tests.support.wait import wait_until

SECRET = "s3cr3t-pw"
ROOT_PASSWORD = "r@@t:pa/ss%w?rd#1"  # every character a URI gives a meaning to


def test_parse_credentials_endpoints_and_prefix() -> None:
    target = parse_etcd_uri("etcd://app%3Aone:p%40ss%2Fword@10.0.0.1:2379,10.0.0.2:2380/logs")
    assert target.endpoints == (("10.0.0.1", 2379), ("10.0.0.2", 2380))
    assert target.prefix == "logs"
    assert target.credentials == EtcdCredentials("app:one", "p@ss/word")
    assert "p@ss/word" not in repr(target)
    plain = parse_etcd_uri("etcd://127.0.0.1:2379")
    assert (plain.credentials, plain.prefix) == (None, "aiobk")


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (f"etcd://root:{SECRET}@h:1/x", "etcd://root:***@h:1/x"),
        (f"etcd://{SECRET}@h:1/x", "etcd://***@h:1/x"),
        (f"etcd://root:{SECRET}/more@h:1/x", "etcd://root:***@h:1/x"),
        (f"root:{SECRET}@h:1", "root:***@h:1"),
        ("etcd://h:1/x", "etcd://h:1/x"),
        ("memory://t", "memory://t"),
    ],
)
def test_redact_uri(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


@pytest.mark.parametrize(
    "uri",
    [
        f"etcd://root:{SECRET}@",  # no endpoint
        f"etcd://root:{SECRET}@h/x",  # no port
        f"etcd://root:{SECRET}@h:99999/x",
        f"etcd://root:{SECRET}@h:1,nope/x",
        f"etcd://:{SECRET}@h:1/x",  # no user
        f"etcd://root{SECRET}@h:1/x",  # no password
        f"etcd://root:{SECRET[:4]}/{SECRET[4:]}@h:1/x",  # an unencoded / in the password
        f"etcd://root:{SECRET[:4]}#{SECRET[4:]}@h:1/x",  # an unencoded #
        f"etcd://root:{SECRET[:4]}?{SECRET[4:]}@h:1/x",  # an unencoded ?
        f"etcd://root:{SECRET}@[h:1/x",
        f"etcdx://root:{SECRET}@h:1/x",
        f"root:{SECRET}@h:1",
    ],
)
def test_a_bad_uri_with_credentials_is_refused_without_echoing_them(uri: str) -> None:
    with pytest.raises(MetadataURIError) as refused:
        open_store(uri)
    message = str(refused.value)
    assert SECRET not in message
    assert SECRET[:4] not in message
    assert SECRET[4:] not in message


def test_store_and_config_reprs_hide_the_password() -> None:
    uri = f"etcd://root:{SECRET}@127.0.0.1:1/x"
    store = open_store(uri)
    shown = [store.uri, store.kv.description, repr(store.kv)]
    shown.append(repr(BookieConfig(data_dir="/d", metadata_uri=uri)))
    assert all(SECRET not in text for text in shown), shown
    assert store.uri == "etcd://root:***@127.0.0.1:1/x"


def _aiobk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiobk", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_error_does_not_echo_the_password() -> None:
    """What went wrong once: the whole ``user:pw@host`` went to gRPC as a host name, and the
    lookup error printed it. Port 1 on loopback: refused at once, no network."""
    result = _aiobk("bookies", "list", "--metadata", f"etcd://root:{SECRET}@127.0.0.1:1/x")
    assert result.returncode == 1
    assert SECRET not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "127.0.0.1:1" in lines[0]


# ---------------------------------------------------------------------------- real etcd, auth


async def _enable_auth(etcd: EtcdProcess, password: str) -> None:
    """``etcdctl user add root``, ``role add root``, ``user grant-role``, ``auth enable``."""
    client = aetcd.Client(host=etcd.host, port=etcd.client_port, timeout=10)
    await client.connect()
    try:
        auth = rpc.AuthStub(client.channel)
        await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=password), timeout=10)
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"), timeout=10)
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        await auth.AuthEnable(rpc.AuthEnableRequest(), timeout=10)
    finally:
        await client.close()


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """An etcd of this module's own with auth enabled; tokens die after 2 idle seconds."""
    server = EtcdProcess(
        data_dir=str(tmp_path_factory.mktemp("auth-etcd")), extra_args=("--auth-token-ttl=2",)
    )
    server.start()
    try:
        asyncio.run(_enable_auth(server, ROOT_PASSWORD))
        yield server
    finally:
        server.stop()


def _uri(etcd: EtcdProcess, prefix: str, password: str = ROOT_PASSWORD) -> str:
    return f"etcd://root:{quote(password, safe='')}@{etcd.endpoint}/{prefix}"


@pytest.fixture
def auth_store(auth_etcd: EtcdProcess) -> tuple[EtcdProcess, str]:
    return auth_etcd, _uri(auth_etcd, unique_name("auth"))


@pytest.mark.timeout(60)
async def test_credentials_authenticate_and_the_others_are_refused(auth_store) -> None:
    etcd, uri = auth_store
    async with open_store(uri, timeout=3.0) as store:
        first = await store.allocate_ledger_id()
        assert await store.allocate_ledger_id() > first
    async with open_store(f"etcd://{etcd.endpoint}/x", timeout=3.0) as anonymous:
        with pytest.raises(MetadataStoreError, match="user name is empty"):
            await anonymous.allocate_ledger_id()
    async with open_store(_uri(etcd, "x", password=SECRET), timeout=3.0) as wrong:
        with pytest.raises(MetadataStoreError, match="authentication failed") as refused:
            await wrong.allocate_ledger_id()
        assert SECRET not in str(refused.value)


@pytest.mark.timeout(60)
async def test_an_idle_token_that_expired_is_renewed(auth_store) -> None:
    _etcd, uri = auth_store
    async with open_store(uri, timeout=3.0) as store:
        first = await store.allocate_ledger_id()
        await asyncio.sleep(4.5)  # twice the token's TTL (etcd checks TTLs every second)
        assert await store.allocate_ledger_id() > first  # "invalid auth token", then renewed


@pytest.mark.timeout(120)
async def test_calls_and_watches_survive_an_etcd_restart_with_auth(auth_store) -> None:
    """etcd's simple tokens live in memory: after a restart every token is unknown. The
    watching store makes no other call, so its watch is created again with the old token
    unless it renews it first (etcd cancels such a watch, and aetcd does not say so)."""
    etcd, uri = auth_store
    metadata = LedgerMetadata(1, 1, 1, (Fragment(0, ("b:1",)),))
    async with open_store(uri, timeout=2.0) as watching:
        ledger_id = await watching.allocate_ledger_id()
        created = await watching.create_ledger(ledger_id, metadata)
        updates = watching.watch_ledger(ledger_id)
        assert await asyncio.wait_for(anext(updates), 10) == created
        await asyncio.to_thread(etcd.restart)
        async with open_store(uri, timeout=2.0) as writer:
            current: LedgerMetadata | None = None

            async def answers() -> bool:
                nonlocal current
                try:
                    current = await writer.read_ledger(ledger_id)
                except MetadataStoreError:
                    return False
                return True

            await wait_until(answers, every=0.1, timeout=60, what="the restarted etcd answers")
            assert current == created
            await writer.write_ledger(ledger_id, current.in_recovery())
        seen = await asyncio.wait_for(anext(updates), 20)
        assert seen is not None
        assert seen.state.value == "IN_RECOVERY"
        await updates.aclose()
        assert (await watching.read_ledger(ledger_id)) == seen  # its unary calls renew too


@pytest.mark.timeout(60)
async def test_a_bookie_registers_through_an_authenticated_uri(
    auth_store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _etcd, uri = auth_store
    bookie = Bookie(BookieConfig(data_dir=str(tmp_path / "b"), port=0, metadata_uri=uri))
    await bookie.start()
    try:
        async with open_store(uri, timeout=3.0) as store:
            assert [b.bookie_id for b in await store.list_bookies()] == [bookie.bookie_id]
        listed = await asyncio.to_thread(_aiobk, "bookies", "list", "--metadata", uri, "--json")
        assert listed.returncode == 0, listed.stderr
        assert bookie.bookie_id in listed.stdout
    finally:
        await bookie.stop()
    assert ROOT_PASSWORD not in caplog.text
