"""TLS and roles on the bookie port, on real bookies with certificates made here.

What a bookie with ``tls_cert_file`` does (``bookie.access``, ``bookie.tls``): clients upgrade
with START_TLS and then handshake; ``tls_only`` refuses anything else; ``tls_client_auth``
requires a certificate from ``tls_ca_file``'s CA and takes the peer's roles from its OU
attributes. A client given a TLS context never falls back to plaintext.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiobk.bookie import Bookie
from aiobk.bookie.access import OPEN, Policy, check, roles_of, subject_name
from aiobk.client import BookKeeper
from aiobk.client.connection import BookieConnection
from aiobk.client.errors import BookieUnavailableError, PermissionDeniedError
from aiobk.client.net import TlsConnector
from aiobk.protocol import (
    ADMIN,
    BOOKIE,
    CLIENT,
    PROTOCOL_VERSION,
    BookieStateRequest,
    GcRequest,
    HandshakeRequest,
    LedgerKeyRequest,
    OpCode,
    ReadLacRequest,
    StartTlsRequest,
    StateChange,
    StatusCode,
    encode,
)
from aiobk.protocol.errors import BKError
from tests.support.certs import CertAuthority, Issued
from tests.support.cluster import Cluster, start_cluster
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(60)


class Certs:
    def __init__(self, root: Path) -> None:
        self.ca = CertAuthority(root / "ca")
        self.bookie = self.ca.issue("bookie", roles=(BOOKIE,))
        self.client = self.ca.issue("app", roles=(CLIENT,))
        self.admin = self.ca.issue("operator", roles=(ADMIN,))
        self.nobody = self.ca.issue("nobody", roles=("sales",))
        self.other_ca = CertAuthority(root / "other", name="another CA")
        self.stranger = self.other_ca.issue("stranger", roles=(ADMIN,))

    def context(self, issued: Issued | None = None, *, ca: Path | None = None) -> ssl.SSLContext:
        """A client context trusting our CA (or ``ca``), showing ``issued`` if given."""
        context = ssl.create_default_context(cafile=str(ca or self.ca.ca_file))
        if issued is not None:
            context.load_cert_chain(*issued.files)
        return context

    def bookie_settings(self, **more: Any) -> dict[str, Any]:
        return {
            "tls_cert_file": str(self.bookie.cert),
            "tls_key_file": str(self.bookie.key),
            "tls_ca_file": str(self.ca.ca_file),
            **more,
        }


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return Certs(tmp_path / "certs")


async def open_conn(bookie: Bookie, context: ssl.SSLContext | None) -> BookieConnection:
    host, port = bookie.address
    connector = TlsConnector(context) if context is not None else None
    return await BookieConnection.open(host, port, timeout=5.0, connector=connector)


@pytest.fixture
async def cluster(tmp_path: Path, certs: Certs) -> AsyncIterator[Cluster]:
    """Three bookies requiring TLS and client certificates."""
    cluster = await start_cluster(
        tmp_path / "cluster",
        3,
        **certs.bookie_settings(tls_only=True, tls_client_auth=True),
        autorecovery_enabled=False,
    )
    yield cluster
    await cluster.stop()


# ---------------------------------------------------------------------- pure rules


def test_access_rules() -> None:
    guarded = Policy(guarded=True, tls_only=True, client_auth=True)
    state = {"tls": True, "handshaken": True}
    assert check(OPEN, OpCode.GC, tls=False, handshaken=False, roles=frozenset()) is None
    plain = check(guarded, OpCode.HANDSHAKE, tls=False, handshaken=False, roles=frozenset())
    assert plain is not None
    assert plain.close
    assert check(guarded, OpCode.START_TLS, tls=False, handshaken=False, roles=frozenset()) is None
    early = check(guarded, OpCode.READ, tls=True, handshaken=False, roles=frozenset({CLIENT}))
    assert early is not None
    assert early.close
    for op in (OpCode.ADD, OpCode.READ, OpCode.READ_LAC, OpCode.WRITE_LAC, OpCode.FORCE):
        for role in (CLIENT, BOOKIE, ADMIN):
            assert check(guarded, op, roles=frozenset({role}), **state) is None
    gc = check(guarded, OpCode.GC, roles=frozenset({CLIENT, BOOKIE}), **state)
    assert gc is not None
    assert not gc.close
    assert "admin" in gc.why
    assert check(guarded, OpCode.GC, roles=frozenset({ADMIN}), **state) is None
    assert check(guarded, OpCode.LEDGER_KEY, roles=frozenset({CLIENT}), **state) is not None
    assert check(guarded, OpCode.LEDGER_KEY, roles=frozenset({BOOKIE}), **state) is None
    assert check(guarded, OpCode.ADD, roles=frozenset(), **state) is not None
    # Plain TLS without client authentication: no roles asked for, a handshake still is.
    tls_only = Policy(guarded=True, tls_only=True)
    assert check(tls_only, OpCode.GC, roles=frozenset(), **state) is None


def test_roles_come_from_the_subject_ou_attributes() -> None:
    cert = {
        "subject": (
            (("commonName", "worker-1"),),
            (("organizationalUnitName", "bookie"),),
            (("organizationalUnitName", "sales"),),
            (("organizationalUnitName", "admin"),),
        )
    }
    assert roles_of(cert) == {BOOKIE, ADMIN}
    assert subject_name(cert) == "worker-1"
    assert roles_of(None) == frozenset()
    assert roles_of({"subject": ((("commonName", "admin"),),)}) == frozenset()  # CN is no role


# ---------------------------------------------------------------------- end to end


async def test_a_tls_client_writes_and_reads_through_tls_only_bookies(
    cluster: Cluster, certs: Certs
) -> None:
    async with BookKeeper(cluster.uri, tls=certs.context(certs.client)) as bk:
        handle = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(20):
            await handle.append(f"entry {i}".encode())
        await handle.close()
        reader = await bk.open_ledger(handle.ledger_id, password=b"pw")
        entries = [e.data for e in await reader.read(0, 19)]
        assert entries == [f"entry {i}".encode() for i in range(20)]
    for bookie in cluster.bookies:
        assert bookie.stats.tls_handshakes >= 1
        assert bookie.stats.permission_denials == 0


async def test_plaintext_is_refused_by_a_tls_only_bookie(cluster: Cluster) -> None:
    bookie = cluster.bookies[0]
    with pytest.raises(PermissionDeniedError):
        await open_conn(bookie, None)
    assert bookie.stats.permission_denials == 1
    # And a raw peer skipping the handshake is disconnected after its EPERM.
    host, port = bookie.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(encode(ReadLacRequest(1, 1)))
    answer = await asyncio.wait_for(reader.read(4096), 5)
    assert answer  # the EPERM error response
    assert await asyncio.wait_for(reader.read(4096), 5) == b""  # then closed
    writer.close()


async def test_a_client_never_falls_back_to_plaintext(
    tmp_path: Path, certs: Certs, start_bookie: Any
) -> None:
    plain = await start_bookie()
    with pytest.raises(BookieUnavailableError, match="does not offer TLS"):
        await open_conn(plain, certs.context(certs.client))
    # A bookie whose certificate the client does not trust: refused by the client.
    tls = await start_bookie(**certs.bookie_settings())
    with pytest.raises(BookieUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
        await open_conn(tls, certs.context(ca=certs.other_ca.ca_file))


async def test_a_certificate_from_another_ca_is_refused(cluster: Cluster, certs: Certs) -> None:
    bookie = cluster.bookies[0]
    with pytest.raises(BookieUnavailableError):
        await open_conn(bookie, certs.context(certs.stranger))
    # No certificate at all: refused the same way (tls_client_auth).
    with pytest.raises(BookieUnavailableError):
        await open_conn(bookie, certs.context())
    await wait_until(lambda: bookie.stats.tls_handshake_failures >= 1, what="a failed handshake")
    async with BookKeeper(cluster.uri, tls=certs.context(certs.stranger)) as bk:
        try:
            handle = await bk.create_ledger(3, 3, 2)
        except BKError as exc:  # no bookie reachable at all: the create says so
            failure: BaseException = exc
        else:
            with pytest.raises(BKError) as caught:
                await handle.append(b"never")
            failure = caught.value
        print("stranger refused:", type(failure).__name__, failure)
        assert "bookie" in str(failure)


async def test_roles_decide_what_a_connection_may_do(cluster: Cluster, certs: Certs) -> None:
    bookie = cluster.bookies[0]
    client = await open_conn(bookie, certs.context(certs.client))
    admin = await open_conn(bookie, certs.context(certs.admin))
    peer = await open_conn(bookie, certs.context(certs.bookie))
    nobody = await open_conn(bookie, certs.context(certs.nobody))
    try:
        refused = await client.send(GcRequest(client.next_txn_id()), 10)
        assert refused.status is StatusCode.EPERM
        refused = await client.send(
            BookieStateRequest(client.next_txn_id(), StateChange.READ_ONLY), 10
        )
        assert refused.status is StatusCode.EPERM
        assert bookie.write_state.writable
        refused = await client.send(LedgerKeyRequest(client.next_txn_id(), 1, b"x" * 32), 10)
        assert refused.status is StatusCode.EPERM
        # The connection stays: the client may still do what its role allows.
        lac = await client.send(ReadLacRequest(client.next_txn_id(), 1), 10)
        assert lac.status is StatusCode.ENOLEDGER
        gc = await admin.send(GcRequest(admin.next_txn_id()), 30)
        assert gc.status is StatusCode.EOK
        key = await peer.send(LedgerKeyRequest(peer.next_txn_id(), 1, b"x" * 32), 10)
        assert key.status is StatusCode.EUA  # past the role check: a wrong proof
        data = await nobody.send(ReadLacRequest(nobody.next_txn_id(), 1), 10)
        assert data.status is StatusCode.EPERM  # a certificate naming no known role
    finally:
        for conn in (client, admin, peer, nobody):
            conn.close()


async def _raw_tls(bookie: Bookie, context: ssl.SSLContext) -> tuple[Any, Any]:
    """A raw connection upgraded by hand: START_TLS, then TLS on the same socket."""
    host, port = bookie.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(encode(StartTlsRequest(1)))
    length = struct.unpack(">I", await reader.readexactly(4))[0]
    await reader.readexactly(length)
    await writer.start_tls(context, server_hostname=host)
    return reader, writer


async def test_a_handshake_comes_before_anything_else(cluster: Cluster, certs: Certs) -> None:
    bookie = cluster.bookies[0]
    reader, writer = await _raw_tls(bookie, certs.context(certs.client))
    writer.write(encode(ReadLacRequest(2, 1)))
    assert await asyncio.wait_for(reader.read(4096), 5)  # EPERM
    assert await asyncio.wait_for(reader.read(4096), 5) == b""  # and closed
    writer.close()
    # With the handshake first, the same request is served.
    reader, writer = await _raw_tls(bookie, certs.context(certs.client))
    writer.write(encode(HandshakeRequest(2, PROTOCOL_VERSION, "raw")))
    writer.write(encode(ReadLacRequest(3, 1)))
    first = await asyncio.wait_for(reader.read(4096), 5)
    assert first
    writer.close()


async def test_bytes_behind_start_tls_close_the_connection(cluster: Cluster) -> None:
    bookie = cluster.bookies[0]
    host, port = bookie.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(encode(StartTlsRequest(1)) + encode(ReadLacRequest(2, 1)))
    assert await asyncio.wait_for(reader.read(4096), 5) == b""
    writer.close()


async def test_a_stalled_tls_handshake_is_dropped(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aiobk.bookie.starttls.TLS_HANDSHAKE_TIMEOUT", 0.5)
    bookie = cluster.bookies[0]
    host, port = bookie.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(encode(StartTlsRequest(1)))
    length = struct.unpack(">I", await reader.readexactly(4))[0]
    await reader.readexactly(length)
    # ... and never starts TLS: closed after the handshake timeout.
    assert await asyncio.wait_for(reader.read(4096), 5) == b""
    writer.close()
    await wait_until(
        lambda: bookie.stats.tls_handshake_failures >= 1 and not bookie.flow.connections,
        what="the stalled handshake counted and its connection gone",
    )


async def test_renewed_certificates_are_used_without_a_restart(
    tmp_path: Path, certs: Certs, start_bookie: Any
) -> None:
    served = certs.ca.issue("bookie-a", roles=(BOOKIE,), file_stem="served")
    bookie = await start_bookie(
        tls_cert_file=str(served.cert),
        tls_key_file=str(served.key),
        tls_ca_file=str(certs.ca.ca_file),
        tls_reload_interval=0.1,
    )

    async def served_name() -> str:
        host, port = bookie.address
        _reader, writer = await asyncio.open_connection(host, port)
        writer.write(encode(StartTlsRequest(1)))
        length = struct.unpack(">I", await _reader.readexactly(4))[0]
        await _reader.readexactly(length)
        await writer.start_tls(certs.context(), server_hostname=host)
        cert = writer.get_extra_info("peercert")
        writer.close()
        return subject_name(cert)

    assert await served_name() == "bookie-a"
    # A broken renewal is ignored (the old pair stays in use) ...
    served.cert.write_text("not a certificate")
    tls = bookie.tls
    assert tls is not None
    await wait_until(lambda: bool(tls.reload_error), what="the broken renewal noticed")
    assert await served_name() == "bookie-a"
    # ... and a good one is picked up.
    certs.ca.issue("bookie-b", roles=(BOOKIE,), file_stem="served")
    os.utime(served.cert)
    await wait_until(lambda: bool(tls.reloads), what="the good renewal loaded")
    assert await served_name() == "bookie-b"


async def test_bad_tls_settings_are_refused_with_one_line(
    tmp_path: Path, certs: Certs, start_bookie: Any
) -> None:
    from aiobk.bookie.config import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        await start_bookie(**certs.bookie_settings(tls_cert_file=str(tmp_path / "missing.pem")))
    with pytest.raises(ConfigError, match="go together"):
        await start_bookie(tls_cert_file=str(certs.bookie.cert))
    with pytest.raises(ConfigError, match="need tls_cert_file"):
        await start_bookie(tls_only=True)
    with pytest.raises(ConfigError, match="cannot be used"):
        await start_bookie(
            **certs.bookie_settings(tls_key_file=str(certs.client.key))  # another cert's key
        )


async def test_the_http_admin_api_is_https_with_roles(certs: Certs, start_bookie: Any) -> None:
    import aiohttp

    from aiobk.runner import start_http_admin

    bookie = await start_bookie(**certs.bookie_settings(tls_client_auth=True), http_port=0)
    http = await start_http_admin(bookie)
    assert http is not None
    assert http.url.startswith("https://")
    try:

        async def ask(
            method: str, path: str, issued: Issued | None, body: object = None
        ) -> tuple[int, str]:
            connector = aiohttp.TCPConnector(ssl=certs.context(issued))
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.request(method, http.url + path, json=body) as response,
            ):
                return response.status, await response.text()

        assert (await ask("GET", "/heartbeat", certs.client))[0] == 200
        assert (await ask("GET", "/api/v1/bookie/state", certs.client))[0] == 200
        status, text = await ask("PUT", "/api/v1/bookie/gc", certs.client)
        assert status == 403
        assert "admin" in text
        read_only = {"readOnly": True}
        assert (await ask("PUT", "/api/v1/bookie/state", certs.client, read_only))[0] == 403
        assert bookie.write_state.writable
        assert (await ask("PUT", "/api/v1/bookie/state", certs.admin, read_only))[0] == 200
        assert not bookie.write_state.writable
        status, _ = await ask("GET", "/api/v1/bookie/state", certs.nobody)
        assert status == 403
        with pytest.raises(aiohttp.ClientError):
            await ask("GET", "/heartbeat", None)  # no client certificate: no handshake
    finally:
        await http.stop()
