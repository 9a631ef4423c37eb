"""Opening a metadata store from its URI (API.md "Metadata service URI").

``etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/PREFIX`` -- a real etcd v3 (prefix defaults
to ``aiobk``). With credentials, every endpoint is authenticated as USER (etcd's
``auth enable``); characters that have a meaning in a URI (``@ : / ? #`` and ``%``) are
percent-encoded in USER and PASSWORD.
``memory://NAME`` -- in process, shared by everything in this process using the same NAME.

A password never leaves this module in anything printable: errors, ``MetadataStore.uri`` and
the stores' descriptions show ``redact_uri(uri)``, where it is ``***``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from aiobk.metadata.kv import EtcdCredentials
from aiobk.metadata.kv_memory import MemoryKV
from aiobk.metadata.store import MetadataStore


class MetadataURIError(ValueError):
    """A metadata URI aiobk cannot use."""


DEFAULT_TIMEOUT = 5.0  # seconds per metadata call; a down etcd is reported within this


def redact_uri(uri: str) -> str:
    """``uri`` fit to print: whatever precedes the last ``@`` of the part after the scheme is
    credentials, shown as ``USER:***`` (or ``***``). It errs on the side of hiding: a URI too
    broken to parse (an unencoded ``/`` in a password) still shows no part of the password."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        scheme, rest = "", uri
    if "@" not in rest:
        return uri
    userinfo, _at, after = rest.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    shown = f"{user}:***" if colon and user and "/" not in user else "***"
    return f"{scheme}{sep}{shown}@{after}"


@dataclass(frozen=True)
class EtcdTarget:
    """An ``etcd://`` URI taken apart."""

    endpoints: tuple[tuple[str, int], ...]
    prefix: str
    credentials: EtcdCredentials | None = None


def parse_etcd_endpoints(netloc: str) -> list[tuple[str, int]]:
    endpoints = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise MetadataURIError(f"etcd endpoint {redact_uri(part)!r} is not HOST:PORT")
        endpoints.append((host, int(port)))
    return endpoints


def parse_etcd_uri(uri: str) -> EtcdTarget:
    """Split ``etcd://[USER:PASSWORD@]HOST:PORT[,...]/PREFIX``; MetadataURIError if it cannot."""
    shown = redact_uri(uri)
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # an unbalanced [ in a host
        raise MetadataURIError(f"{shown!r} is not a URI: {exc}") from None
    if parts.scheme != "etcd":
        raise MetadataURIError(f"{shown!r} is not an etcd:// URI")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise MetadataURIError(f"{shown!r} names no etcd endpoint")
    if parts.query or parts.fragment:
        # An unencoded ? or # in a password cuts the URI short: say so, show nothing of it.
        raise MetadataURIError(
            f"{shown!r}: an etcd URI takes no ?query or #fragment "
            "(percent-encode ? and # in a user name or password)"
        )
    credentials = None
    if at:
        user, colon, password = userinfo.partition(":")
        if not user or not colon or not password:
            raise MetadataURIError(
                f"{shown!r}: credentials must be USER:PASSWORD@ "
                "(percent-encode @ : / ? # % in them)"
            )
        credentials = EtcdCredentials(unquote(user), unquote(password))
    elif "@" in uri:
        # The @ is past the first /: an unencoded / in a password put it in the path.
        raise MetadataURIError(
            f"{shown!r}: an @ after the endpoints (percent-encode / in a password as %2F)"
        )
    endpoints = parse_etcd_endpoints(hosts)
    return EtcdTarget(tuple(endpoints), parts.path.strip("/") or "aiobk", credentials)


def open_store(uri: str, *, timeout: float = DEFAULT_TIMEOUT) -> MetadataStore:
    """A store for ``uri``. No I/O happens until the first call (etcd connects lazily)."""
    if uri.startswith("memory://"):
        name = uri[len("memory://") :].strip("/")
        if not name:
            raise MetadataURIError("memory:// needs a name, e.g. memory://test")
        return MetadataStore(MemoryKV.shared(name), "aiobk", uri)
    if uri.startswith("etcd://"):
        from aiobk.metadata.kv_etcd import EtcdKV  # noqa: PLC0415 - grpc loads only for etcd URIs

        target = parse_etcd_uri(uri)
        kv = EtcdKV(list(target.endpoints), timeout, credentials=target.credentials)
        return MetadataStore(kv, target.prefix, redact_uri(uri))
    raise MetadataURIError(
        f"unsupported metadata URI {redact_uri(uri)!r}: use etcd://HOST:PORT/PREFIX or "
        "memory://NAME"
    )
