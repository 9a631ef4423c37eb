"""A bookie listening on every interface publishes an address clients can dial (with
``--host 0.0.0.0`` it used to register as ``0.0.0.0:PORT``)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aiobk.bookie import Bookie, BookieConfig, ConfigError, advertised
from aiobk.bookie.advertised import routable_host
from aiobk.client import BookieConnection
from aiobk.metadata import open_store
from aiobk.protocol import GetBookieInfoRequest, GetBookieInfoResponse
from tests.support.names import unique_name


def _resolve_to(monkeypatch: pytest.MonkeyPatch, address: str | None) -> list[int]:
    calls: list[int] = []

    def fake() -> str | None:
        calls.append(1)
        return address

    monkeypatch.setattr(advertised, "routable_host", fake)
    return calls


async def _registered(uri: str) -> list[tuple[str, str]]:
    async with open_store(uri) as store:
        return [(info.bookie_id, info.address) for info in await store.list_bookies()]


async def test_wildcard_host_registers_the_resolved_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The resolver is stubbed to answer loopback so that the test dials what was published."""
    calls = _resolve_to(monkeypatch, "127.0.0.1")
    uri = f"memory://{unique_name('wild')}"
    wild = Bookie(
        BookieConfig(data_dir=str(tmp_path / "b"), host="0.0.0.0", port=0, metadata_uri=uri)
    )
    await wild.start()
    try:
        port = wild.address.port
        expected = f"127.0.0.1:{port}"
        assert await _registered(uri) == [(expected, expected)]  # was 0.0.0.0:PORT
        assert calls == [1]
        assert str(wild.address) == f"0.0.0.0:{port}"  # listening everywhere
        assert wild.bookie_id == expected
        host, _sep, dial_port = expected.rpartition(":")
        conn = await BookieConnection.open(host, int(dial_port))
        try:
            answer = await conn.call(GetBookieInfoRequest(conn.next_txn_id()), 10)
            assert isinstance(answer, GetBookieInfoResponse)
        finally:
            conn.close()
    finally:
        await wild.stop()


async def test_wildcard_host_without_a_routable_address_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _resolve_to(monkeypatch, None)
    uri = f"memory://{unique_name('wild')}"
    refused = Bookie(
        BookieConfig(data_dir=str(tmp_path / "b"), host="0.0.0.0", port=0, metadata_uri=uri)
    )
    try:
        with pytest.raises(ConfigError, match="--advertised-address"):
            await refused.start()
    finally:
        await refused.stop()  # a no-op unless it started (it did, before the fix)
    assert not refused.running
    assert await _registered(uri) == []
    assert not (tmp_path / "b").exists()  # refused before anything was written


async def test_an_advertised_address_is_published_as_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _resolve_to(monkeypatch, None)  # never asked: the address is given
    uri = f"memory://{unique_name('wild')}"
    config = BookieConfig(
        data_dir=str(tmp_path / "b"),
        host="0.0.0.0",
        port=0,
        metadata_uri=uri,
        advertised_address="bookie-7.example:3181",
    )
    given = Bookie(config)
    await given.start()
    try:
        assert calls == []
        assert await _registered(uri) == [("bookie-7.example:3181", "bookie-7.example:3181")]
    finally:
        await given.stop()


async def test_a_bookie_id_kept_from_before_publishes_a_dialable_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bookie first started as 0.0.0.0:PORT keeps its identity (ledger ensembles name it)
    with --bookie-id 0.0.0.0:PORT; the address it publishes is the resolved one."""
    _resolve_to(monkeypatch, "127.0.0.1")
    uri = f"memory://{unique_name('wild')}"
    config = BookieConfig(
        data_dir=str(tmp_path / "b"),
        host="0.0.0.0",
        port=0,
        metadata_uri=uri,
        bookie_id="0.0.0.0:1",
    )
    kept = Bookie(config)
    await kept.start()
    try:
        assert await _registered(uri) == [("0.0.0.0:1", f"127.0.0.1:{kept.address.port}")]
    finally:
        await kept.stop()


def test_routable_host_is_an_address_of_this_host() -> None:
    found = routable_host()
    if found is None:  # no route off this machine: nothing to check but the refusal above
        return
    ip = ipaddress.ip_address(found.partition("%")[0])
    assert not ip.is_loopback
    assert not ip.is_link_local
    assert not ip.is_unspecified
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((found, 0))  # only an address of this host can be bound


@pytest.mark.timeout(60)
async def test_bookie_start_host_0000_through_the_cli(etcd_server, tmp_path: Path) -> None:
    """The real resolver, a real process: it registers this host's address or refuses."""
    uri = etcd_server.uri(unique_name("wildcli"))
    command = [
        sys.executable, "-m", "aiobk.bookie", "start", "--host", "0.0.0.0", "--port", "0",
        "--data-dir", str(tmp_path / "b"), "--metadata", uri,
    ]  # fmt: skip
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        expected_host = routable_host()
        if expected_host is None:
            assert proc.wait(30) != 0
            assert proc.stderr is not None
            assert "--advertised-address" in proc.stderr.read()
            return
        assert "serving on 0.0.0.0:" in line, line
        port = int(line.rsplit(":", 1)[1])
        expected = f"{expected_host}:{port}"
        assert await _registered(uri) == [(expected, expected)]
    finally:
        proc.terminate()
        proc.wait(30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
