"""A secured etcd, for real: TLS to etcd through ``etcds://``, client certificates,
etcd's auth with a user whose role covers only the store's prefix, tokens that idle out, and
refusals that are one line, fast, and never hold the password. The etcds are the session's
(``tests/metadata/conftest.py``); the store's whole contract on the secured one is in
``test_etcd_contract_secured.py``."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from aiobk.metadata import (
    BookieServiceInfo,
    EtcdProcess,
    Fragment,
    LedgerMetadata,
    MetadataAuthError,
    MetadataPermissionError,
    open_store,
)
from aiobk.metadata.uri import ENV_PASSWORD, ENV_PASSWORD_FILE, ENV_USER
from aiobk.protocol.errors import MetadataStoreError
from tests.metadata.conftest import (
    APP_PASSWORD,
    APP_PREFIX,
    APP_USER,
    ROOT_PASSWORD,
    STRANGER_PASSWORD,
    STRANGER_USER,
    TOKEN_TTL,
    SecuredEtcd,
    start_tls_etcd,
)
from tests.support.certs import CertAuthority
from tests.support.names import unique_name
from tests.support.procs import BookieProcess
from tests.support.wait import wait_until

WRONG_PASSWORD = "not-the-Password-42"
METADATA = LedgerMetadata(1, 1, 1, (Fragment(0, ("127.0.0.1:1",)),))


def _one_line_without(message: str, *secrets: str) -> None:
    assert "\n" not in message, message
    for secret in secrets:
        assert secret not in message, message


# ---------------------------------------------------------------------------------------- TLS


@pytest.mark.timeout(60)
async def test_a_tls_etcd_works_end_to_end_through_etcds(
    tls_etcd: EtcdProcess, cert_authority: CertAuthority
) -> None:
    """Ledger metadata, a watch and a lease (a bookie's registration) over TLS."""
    uri = tls_etcd.uri(unique_name("tls"))
    assert uri.startswith("etcds://")
    assert f"ca={cert_authority.ca_file}" in uri
    async with open_store(uri, timeout=3.0) as store, open_store(uri, timeout=3.0) as other:
        ledger_id = await store.allocate_ledger_id()
        created = await store.create_ledger(ledger_id, METADATA)
        updates = store.watch_ledger(ledger_id)
        assert await asyncio.wait_for(anext(updates), 10) == created
        assert await other.read_ledger(ledger_id) == created
        closed = await other.write_ledger(ledger_id, created.closed(-1, 0))
        assert await asyncio.wait_for(anext(updates), 10) == closed
        await updates.aclose()
        registration = await store.register_bookie(BookieServiceInfo("b1", "127.0.0.1:1"), ttl=3)
        assert [b.bookie_id for b in await other.list_bookies()] == ["b1"]
        await registration.close()
        assert await other.list_bookies() == []


@pytest.mark.timeout(30)
async def test_an_etcd_certificate_from_another_ca_is_refused_at_once(
    tls_etcd: EtcdProcess, tmp_path: Path
) -> None:
    stranger_ca = CertAuthority(tmp_path / "other", name="other CA")
    uri = f"etcds://{tls_etcd.endpoint}/x?ca={stranger_ca.ca_file}"
    started = time.monotonic()
    async with open_store(uri, timeout=3.0) as store:
        with pytest.raises(MetadataAuthError) as refused:
            await store.allocate_ledger_id()
    assert time.monotonic() - started < 2.0  # a handshake refused, not a timeout
    message = str(refused.value)
    _one_line_without(message)
    assert f"etcd {tls_etcd.endpoint}: TLS handshake failed" in message
    assert f"not signed by {stranger_ca.ca_file}" in message


@pytest.mark.timeout(30)
async def test_plaintext_to_a_tls_etcd_says_what_is_wrong(tls_etcd: EtcdProcess) -> None:
    async with open_store(f"etcd://{tls_etcd.endpoint}/x", timeout=3.0) as store:
        with pytest.raises(MetadataStoreError, match="if this etcd serves TLS: etcds://") as bad:
            await store.allocate_ledger_id()
    _one_line_without(str(bad.value))


@pytest.mark.timeout(30)
async def test_etcd_requiring_client_certificates_refuses_the_others(
    secured_etcd: SecuredEtcd, tmp_path: Path
) -> None:
    etcd, ca = secured_etcd.etcd, secured_etcd.ca
    who = f"{quote(APP_USER)}:{quote(APP_PASSWORD, safe='')}@{etcd.endpoint}/{APP_PREFIX}/c"
    async with open_store(f"etcds://{who}?ca={ca.ca_file}", timeout=3.0) as store:
        with pytest.raises(MetadataAuthError, match="etcd requires a client certificate"):
            await store.allocate_ledger_id()
    foreign = CertAuthority(tmp_path / "foreign", name="foreign CA").issue("intruder", ips=())
    uri = f"etcds://{who}?ca={ca.ca_file}&cert={foreign.cert}&key={foreign.key}"
    async with open_store(uri, timeout=3.0) as store:
        with pytest.raises(MetadataAuthError, match="did not accept the client certificate"):
            await store.allocate_ledger_id()


# --------------------------------------------------------------------------------------- auth


@pytest.mark.timeout(60)
@pytest.mark.parametrize("form", ["uri", "password_file", "env", "env_file"])
async def test_the_right_credentials_work_in_every_form(
    secured_etcd: SecuredEtcd, form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in (ENV_USER, ENV_PASSWORD, ENV_PASSWORD_FILE):
        monkeypatch.delenv(variable, raising=False)
    password_file = tmp_path / "etcd-password"
    password_file.write_text(APP_PASSWORD + "\n")
    if form == "uri":
        uri = secured_etcd.uri()
    elif form == "password_file":
        uri = secured_etcd.uri(password=None, options=f"password_file={quote(str(password_file))}")
    else:
        monkeypatch.setenv(ENV_USER, APP_USER)
        if form == "env":
            monkeypatch.setenv(ENV_PASSWORD, APP_PASSWORD)
        else:
            monkeypatch.setenv(ENV_PASSWORD_FILE, str(password_file))
        uri = secured_etcd.uri(user=None)
    assert APP_PASSWORD not in uri or form == "uri"
    async with open_store(uri, timeout=3.0) as store:
        ledger_id = await store.allocate_ledger_id()
        created = await store.create_ledger(ledger_id, METADATA)
        assert await store.read_ledger(ledger_id) == created
        assert APP_PASSWORD not in store.uri


@pytest.mark.timeout(60)
async def test_a_wrong_password_is_one_line_that_does_not_echo_it(
    secured_etcd: SecuredEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    async with open_store(secured_etcd.uri(password=WRONG_PASSWORD), timeout=3.0) as store:
        with pytest.raises(MetadataAuthError) as refused:
            await store.allocate_ledger_id()
    assert time.monotonic() - started < 2.0
    message = str(refused.value)
    assert message == (
        f"etcd {secured_etcd.etcd.endpoint}: authentication failed for user {APP_USER!r} "
        "(wrong user name or password)"
    )
    _one_line_without(message, WRONG_PASSWORD, quote(WRONG_PASSWORD, safe=""))
    assert WRONG_PASSWORD not in caplog.text


@pytest.mark.timeout(60)
def test_the_cli_refuses_a_wrong_password_in_one_line(secured_etcd: SecuredEtcd) -> None:
    """As an operator sees it: the URI in AIOBK_METADATA, a one-line error, exit 1."""
    env = dict(os.environ, AIOBK_METADATA=secured_etcd.uri(password=WRONG_PASSWORD))
    for variable in (ENV_USER, ENV_PASSWORD, ENV_PASSWORD_FILE):
        env.pop(variable, None)
    result = subprocess.run(
        [sys.executable, "-m", "aiobk", "bookies", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "authentication failed for user" in lines[0]
    assert WRONG_PASSWORD not in result.stderr


@pytest.mark.timeout(30)
async def test_no_user_where_auth_is_on_says_so(secured_etcd: SecuredEtcd) -> None:
    """With client certificates on, etcd takes the certificate's common name for the user
    (here one it does not know); without, it says the user name is empty (test_uri.py)."""
    async with open_store(secured_etcd.uri(user=None), timeout=3.0) as store:
        with pytest.raises(MetadataPermissionError, match="no user given: etcd takes a client"):
            await store.allocate_ledger_id()


@pytest.mark.timeout(60)
async def test_a_user_whose_role_does_not_cover_the_prefix_is_denied(
    secured_etcd: SecuredEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    """The stranger's role covers /elsewhere/ only; the store lives under /secure/."""
    caplog.set_level(logging.DEBUG)
    uri = secured_etcd.uri(user=STRANGER_USER, password=STRANGER_PASSWORD)
    async with open_store(uri, timeout=3.0) as store:
        with pytest.raises(MetadataPermissionError) as denied:
            await store.allocate_ledger_id()
        message = str(denied.value)
        _one_line_without(message, STRANGER_PASSWORD)
        assert f"permission denied to user {STRANGER_USER!r} for allocate on '/{APP_PREFIX}/" in (
            message
        )
        with pytest.raises(MetadataPermissionError):
            await store.list_bookies()
        # A watch hears of it too (etcd would cancel it silently), instead of waiting forever.
        watch = await store.kv.watch(store.keys.bookies, prefix=True, start_revision=1)
        with pytest.raises(MetadataPermissionError):
            await watch.next(10)
        await watch.close()
    assert STRANGER_PASSWORD not in caplog.text


@pytest.mark.timeout(60)
async def test_connect_checks_credentials_before_the_first_call(
    secured_etcd: SecuredEtcd,
) -> None:
    """``EtcdKV.connect()``: the wrong password shows at once; a user limited to its prefix
    connects (the probe outside its prefix is denied, and that is fine)."""
    async with open_store(secured_etcd.uri(password=WRONG_PASSWORD), timeout=3.0) as store:
        with pytest.raises(MetadataAuthError, match="authentication failed"):
            await store.kv.connect()  # type: ignore[attr-defined]
    async with open_store(secured_etcd.uri(), timeout=3.0) as store:
        await store.kv.connect()  # type: ignore[attr-defined]
        assert await store.allocate_ledger_id() > 0


# ------------------------------------------------------------------------------ token expiry


async def _idle_past_the_token() -> None:
    await asyncio.sleep(2 * TOKEN_TTL + 0.5)  # etcd checks token TTLs every second


@pytest.mark.timeout(90)
async def test_calls_watches_and_leases_outlive_their_token(secured_etcd: SecuredEtcd) -> None:
    """Every kind of call made after the token idled out: unary calls (many at once: none
    may fail because another renewed the token under it), a watch made before, a watch made
    after, a lease granted before, a bookie registration kept alive throughout."""
    uri = secured_etcd.uri()
    # Twenty callers renewing one token at once wait on etcd's bcrypt check of the password
    # (tens of milliseconds each, seconds on a loaded machine): the time limit here is for a
    # call that hangs, not a latency target.
    async with open_store(uri, timeout=10.0) as store, open_store(uri, timeout=10.0) as writer:
        ledger_id = await store.allocate_ledger_id()
        created = await store.create_ledger(ledger_id, METADATA)
        old_watch = store.watch_ledger(ledger_id)
        assert await asyncio.wait_for(anext(old_watch), 10) == created
        lease, _ttl = await store.kv.grant_lease(60)
        registration = await writer.register_bookie(BookieServiceInfo("b1", "h:1"), ttl=3)
        await _idle_past_the_token()
        # Many calls at once on a dead token: each is refused, one renews, all retry.
        ids = await asyncio.gather(*(store.allocate_ledger_id() for _ in range(20)))
        assert len(set(ids)) == 20
        assert await store.kv.keep_alive(lease) > 0
        changed = await writer.write_ledger(ledger_id, created.in_recovery())
        assert await asyncio.wait_for(anext(old_watch), 10) == changed
        await _idle_past_the_token()
        new_watch = store.watch_ledger(ledger_id)  # its first read renews the token
        assert await asyncio.wait_for(anext(new_watch), 10) == changed
        await _idle_past_the_token()
        closed = await writer.write_ledger(ledger_id, changed.closed(-1, 0))
        assert await asyncio.wait_for(anext(old_watch), 10) == closed
        assert await asyncio.wait_for(anext(new_watch), 10) == closed
        await old_watch.aclose()
        await new_watch.aclose()
        assert not registration.lost.is_set()
        assert [b.bookie_id for b in await store.list_bookies()] == ["b1"]
        await registration.close()
        await store.kv.revoke_lease(lease)


@pytest.mark.timeout(90)
async def test_a_secured_etcd_restarts_and_the_store_carries_on(tmp_path: Path) -> None:
    """etcd's simple tokens live in its memory: after a restart of a TLS + auth etcd, the
    process's own probes find it ready again and a store authenticates anew."""
    ca = CertAuthority(tmp_path / "ca")
    etcd = start_tls_etcd(tmp_path, ca, client_cert_auth=True)
    try:
        etcd.gateway.enable_auth(ROOT_PASSWORD)
        etcd.gateway.add_user("app", "app-pw", key_prefix="/p/", root_password=ROOT_PASSWORD)
        uri = etcd.uri("p", user="app", password="app-pw")
        async with open_store(uri, timeout=2.0) as store:
            first = await store.allocate_ledger_id()
            await asyncio.to_thread(etcd.restart)
            assert etcd.status() is not None

            async def answers() -> bool:
                try:
                    assert await store.allocate_ledger_id() > first
                except MetadataAuthError:
                    raise
                except MetadataStoreError:  # unreachable while it restarts
                    return False
                return True

            await wait_until(answers, every=0.1, timeout=60, what="the restarted etcd answers")
    finally:
        etcd.stop()


# ---------------------------------------------------------------------------- a real cluster


@pytest.mark.timeout(120)
async def test_a_bookie_process_and_a_client_work_on_a_secured_etcd(
    secured_etcd: SecuredEtcd, tmp_path: Path
) -> None:
    """The bookie takes its URI from AIOBK_METADATA (no password on its command line); the
    client reads the password from a file. A ledger of ensemble 1 written and read back."""
    from aiobk.client import BookKeeper

    prefix = f"{APP_PREFIX}/{unique_name('e2e')}"
    password_file = tmp_path / "pw"
    password_file.write_text(APP_PASSWORD + "\n")
    bookie = BookieProcess(
        tmp_path / "bookie",
        None,
        "--log-level",
        "debug",
        env={"AIOBK_METADATA": secured_etcd.uri(prefix)},
    )
    await bookie.start()
    try:
        assert bookie.process is not None
        with open(f"/proc/{bookie.process.pid}/cmdline", "rb") as handle:
            assert APP_PASSWORD.encode() not in handle.read()
        client_uri = secured_etcd.uri(
            prefix, password=None, options=f"password_file={quote(str(password_file))}"
        )
        async with BookKeeper(client_uri) as bk:
            lh = await bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
            for index in range(10):
                await lh.append(b"entry-%d" % index)
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            entries = await rh.read(0, 9)
            assert [e.data for e in entries] == [b"entry-%d" % i for i in range(10)]
            await rh.close()
    finally:
        assert bookie.terminate() == 0
    log = bookie.log_path.read_text(errors="replace")
    assert APP_PASSWORD not in log
    assert quote(APP_PASSWORD, safe="") not in log
