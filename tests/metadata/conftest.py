"""A secured etcd for the metadata tests: TLS on its client port with client
certificates required, etcd's auth on with ``root`` and two users whose roles each cover one
key prefix, and tokens that idle out after 2 s (``--auth-token-ttl=2``) so that every test
using it also rides through token renewals. Certificates come from a CA made here.

Started once per session, and only when a test asks for it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from aiobk.metadata import EtcdProcess, EtcdServerTLS
from tests.support.certs import CertAuthority, Issued
from tests.support.names import unique_name

ROOT_PASSWORD = "r00t:pw/with@all?the#uri%chars"
APP_USER = "aiobk-app"
APP_PASSWORD = "app pw:@/?#%&+ ünïcødé"  # every character a URI gives a meaning to, and more
APP_PREFIX = "secure"  # the app user's role: readwrite on /secure/ only
STRANGER_USER = "stranger"
STRANGER_PASSWORD = "stranger-pw-0987"
STRANGER_PREFIX = "elsewhere"
TOKEN_TTL = 2  # seconds an idle token lives


@dataclass
class SecuredEtcd:
    etcd: EtcdProcess
    ca: CertAuthority
    client: Issued  # a client certificate etcd accepts

    @property
    def tls_options(self) -> str:
        return (
            f"ca={quote(str(self.ca.ca_file))}&cert={quote(str(self.client.cert))}"
            f"&key={quote(str(self.client.key))}"
        )

    def uri(
        self,
        prefix: str | None = None,
        *,
        user: str | None = APP_USER,
        password: str | None = APP_PASSWORD,
        options: str = "",
    ) -> str:
        """``etcds://USER:PASSWORD@HOST:PORT/PREFIX?ca&cert&key``; the prefix defaults to a
        fresh one under the app user's ``secure/``."""
        prefix = prefix or f"{APP_PREFIX}/{unique_name('t')}"
        who = ""
        if user is not None:
            who = quote(user, safe="")
            who += f":{quote(password, safe='')}@" if password is not None else "@"
        extra = f"&{options}" if options else ""
        return f"etcds://{who}{self.etcd.endpoint}/{prefix}?{self.tls_options}{extra}"


def start_tls_etcd(
    directory: Path, ca: CertAuthority, *, client_cert_auth: bool, extra_args: tuple[str, ...] = ()
) -> EtcdProcess:
    server = ca.issue("etcd", ips=("127.0.0.1",), file_stem=f"etcd-{directory.name}")
    tls = EtcdServerTLS(
        str(server.cert), str(server.key), str(ca.ca_file), client_cert_auth=client_cert_auth
    )
    return EtcdProcess(data_dir=str(directory / "etcd"), tls=tls, extra_args=extra_args).start()


@pytest.fixture(scope="session")
def cert_authority(tmp_path_factory: pytest.TempPathFactory) -> CertAuthority:
    return CertAuthority(tmp_path_factory.mktemp("etcd-ca"))


@pytest.fixture(scope="session")
def tls_etcd(
    tmp_path_factory: pytest.TempPathFactory, cert_authority: CertAuthority
) -> Iterator[EtcdProcess]:
    """TLS on the client port, nothing else: no client certificates, no auth."""
    etcd = start_tls_etcd(
        tmp_path_factory.mktemp("tls-etcd"), cert_authority, client_cert_auth=False
    )
    yield etcd
    etcd.stop()


@pytest.fixture(scope="session")
def secured_etcd(
    tmp_path_factory: pytest.TempPathFactory, cert_authority: CertAuthority
) -> Iterator[SecuredEtcd]:
    """TLS with client certificates, auth with root, the app user (``/secure/``) and the
    stranger (``/elsewhere/``), 2 s tokens."""
    etcd = start_tls_etcd(
        tmp_path_factory.mktemp("secured-etcd"),
        cert_authority,
        client_cert_auth=True,
        extra_args=(f"--auth-token-ttl={TOKEN_TTL}",),
    )
    try:
        etcd.gateway.enable_auth(ROOT_PASSWORD)
        for user, password, prefix in (
            (APP_USER, APP_PASSWORD, APP_PREFIX),
            (STRANGER_USER, STRANGER_PASSWORD, STRANGER_PREFIX),
        ):
            etcd.gateway.add_user(
                user, password, key_prefix=f"/{prefix}/", root_password=ROOT_PASSWORD
            )
        client = cert_authority.issue("aiobk client", ips=(), dns=(), file_stem="etcd-client")
        yield SecuredEtcd(etcd, cert_authority, client)
    finally:
        etcd.stop()
