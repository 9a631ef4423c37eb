"""Opening a metadata store from its metadata service URI.

``etcd://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/PREFIX[?OPTIONS]`` -- a real etcd v3 (the
prefix defaults to ``aiobk``). ``etcds://`` is the same over TLS. Options, ``&``-separated:

- ``ca=PATH``: the PEM bundle that signs etcd's certificate (default: the system's roots);
- ``cert=PATH&key=PATH``: a client certificate, for an etcd run with ``--client-cert-auth``;
- ``password_file=PATH``: the password, read from a file (one trailing newline dropped).

Any of ``ca``, ``cert``, ``key`` turns TLS on for an ``etcd://`` URI too. Characters with a
meaning in a URI (``@ : / ? # & %``) are percent-encoded in USER, PASSWORD and the paths.

Credentials (etcd's ``auth enable``) are taken, for each part, from the first place that has it:

- the user: the URI's ``USER@``, then ``AIOBK_ETCD_USER``;
- the password: the URI's ``:PASSWORD``, then ``?password_file=``, then
  ``AIOBK_ETCD_PASSWORD``, then ``AIOBK_ETCD_PASSWORD_FILE`` (a file, as ``password_file``).

So ``etcd://app@HOST:PORT/x`` with the password in the environment works, and an environment
with both variables names everyone's credentials for URIs that name none. Two sources for the
password in one place (``:PASSWORD`` and ``password_file``; both password variables) are
refused, as are a user without a password and a password without a user.

``memory://NAME`` -- in process, shared by everything in this process using the same NAME.

A password never leaves this module in anything printable: errors, ``repr`` of the parsed URI,
``MetadataStore.uri`` and the stores' descriptions show ``redact_uri(uri)``, where it is ``***``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from aiobk.metadata.kv import EtcdCredentials, EtcdTLS
from aiobk.metadata.kv_memory import MemoryKV
from aiobk.metadata.store import MetadataStore


class MetadataURIError(ValueError):
    """A metadata URI aiobk cannot use."""


DEFAULT_TIMEOUT = 5.0  # seconds per metadata call; a down etcd is reported within this

ENV_USER = "AIOBK_ETCD_USER"
ENV_PASSWORD = "AIOBK_ETCD_PASSWORD"
ENV_PASSWORD_FILE = "AIOBK_ETCD_PASSWORD_FILE"
OPTIONS = ("ca", "cert", "key", "password_file")
# A password given as a query parameter (not an option, but a user may try): hidden too.
_SECRET_PARAMETER = re.compile(r"([?&](?:password|passwd|pass|pw|token)=)[^&#]*", re.IGNORECASE)


def redact_uri(uri: str) -> str:
    """``uri`` fit to print: whatever precedes the last ``@`` of the part after the scheme is
    credentials, shown as ``USER:***`` (or ``***``), and a ``password=`` parameter's value is
    ``***``. It errs on the side of hiding: a URI too broken to parse (an unencoded ``/`` in a
    password) still shows no part of the password."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        scheme, rest = "", uri
    if "@" in rest:
        userinfo, _at, after = rest.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        shown = f"{user}:***" if colon and user and "/" not in user else "***"
        rest = f"{shown}@{after}"
    return _SECRET_PARAMETER.sub(r"\1***", f"{scheme}{sep}{rest}")


@dataclass(frozen=True)
class EtcdTarget:
    """An ``etcd://`` or ``etcds://`` URI taken apart; its repr shows no password."""

    endpoints: tuple[tuple[str, int], ...]
    prefix: str
    credentials: EtcdCredentials | None = None
    tls: EtcdTLS | None = None


def parse_etcd_endpoints(netloc: str) -> list[tuple[str, int]]:
    endpoints = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise MetadataURIError(f"etcd endpoint {redact_uri(part)!r} is not HOST:PORT")
        endpoints.append((host, int(port)))
    return endpoints


def _options(query: str, shown: str) -> dict[str, str]:
    """``?a=b&c=d`` percent-decoded (a ``+`` stays a ``+``: paths are not form data)."""
    found: dict[str, str] = {}
    for item in query.split("&") if query else ():
        name, equals, value = item.partition("=")
        if name not in OPTIONS:
            hint = f"takes {', '.join(OPTIONS)}" if equals else "options are NAME=VALUE"
            raise MetadataURIError(f"{shown!r}: unknown option {name!r} ({hint})")
        if not value:
            raise MetadataURIError(f"{shown!r}: option {name!r} needs a value")
        if name in found:
            raise MetadataURIError(f"{shown!r}: option {name!r} is given twice")
        found[name] = unquote(value)
    return found


def _read_password(path: str, source: str, shown: str) -> str:
    """The password in file ``path``, without its trailing newline."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        password = data.decode()
    except OSError as exc:
        raise MetadataURIError(
            f"{shown!r}: cannot read the etcd password file {path!r} ({source}): "
            f"{exc.strerror or type(exc).__name__}"
        ) from None
    except UnicodeDecodeError:
        raise MetadataURIError(
            f"{shown!r}: the etcd password file {path!r} ({source}) is not UTF-8 text"
        ) from None
    password = password.removesuffix("\n").removesuffix("\r")
    if not password:
        raise MetadataURIError(f"{shown!r}: the etcd password file {path!r} ({source}) is empty")
    return password


def _credentials(
    user: str | None,
    password: str | None,
    password_file: str | None,
    env: Mapping[str, str],
    shown: str,
) -> EtcdCredentials | None:
    """The user and password from the first place that has each (module doc)."""
    if password is not None and password_file is not None:
        raise MetadataURIError(f"{shown!r}: a password in the URI and a password_file: pick one")
    if user is None:
        user = env.get(ENV_USER) or None
    if password is None and password_file is not None:
        password = _read_password(password_file, "password_file", shown)
    if password is None:
        from_env, env_file = env.get(ENV_PASSWORD) or None, env.get(ENV_PASSWORD_FILE) or None
        if from_env is not None and env_file is not None:
            raise MetadataURIError(f"both {ENV_PASSWORD} and {ENV_PASSWORD_FILE} are set: pick one")
        password = from_env
        if env_file is not None:
            password = _read_password(env_file, ENV_PASSWORD_FILE, shown)
    if user is None and password is None:
        return None
    if user is None:
        raise MetadataURIError(
            f"{shown!r}: an etcd password but no user (USER@ in the URI, or {ENV_USER})"
        )
    if password is None:
        raise MetadataURIError(
            f"{shown!r}: no password for the etcd user (USER:PASSWORD@, ?password_file=PATH, "
            f"{ENV_PASSWORD} or {ENV_PASSWORD_FILE})"
        )
    return EtcdCredentials(user, password)


def _tls(scheme: str, options: Mapping[str, str], shown: str) -> EtcdTLS | None:
    ca, cert, key = options.get("ca"), options.get("cert"), options.get("key")
    if scheme == "etcd" and ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise MetadataURIError(f"{shown!r}: a client certificate needs both cert= and key=")
    tls = EtcdTLS(ca, cert, key)
    for what, path in (("ca", ca), ("cert", cert), ("key", key)):
        if path is not None and not os.access(path, os.R_OK):
            raise MetadataURIError(f"{shown!r}: the {what} file {path!r} cannot be read")
    return tls


def parse_etcd_uri(uri: str, env: Mapping[str, str] | None = None) -> EtcdTarget:
    """Take ``etcd[s]://[USER[:PASSWORD]@]HOST:PORT[,...]/PREFIX[?OPTIONS]`` apart, with the
    credentials the environment (``env``, default ``os.environ``) adds (module doc); reads a
    password file. MetadataURIError, with the password hidden, if it cannot."""
    shown = redact_uri(uri)
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # an unbalanced [ in a host
        raise MetadataURIError(f"{shown!r} is not a URI: {exc}") from None
    if parts.scheme not in ("etcd", "etcds"):
        raise MetadataURIError(f"{shown!r} is not an etcd:// or etcds:// URI")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "@" in uri.partition("://")[2][len(parts.netloc) :]:
        # An unencoded / ? or # in a password ended the endpoints early: the @ that ends the
        # credentials landed in the path, the query or the fragment. Say so, show none of it.
        raise MetadataURIError(
            f"{shown!r}: an @ after the endpoints (percent-encode / ? # in a password, "
            "and an @ anywhere else, as %2F %3F %23 %40)"
        )
    if not hosts:
        raise MetadataURIError(f"{shown!r} names no etcd endpoint")
    if parts.fragment:
        raise MetadataURIError(f"{shown!r}: an etcd URI takes no #fragment")
    options = _options(parts.query, shown)
    user = password = None
    if at:
        raw_user, colon, raw_password = userinfo.partition(":")
        if not raw_user or (colon and not raw_password):
            raise MetadataURIError(
                f"{shown!r}: credentials must be USER:PASSWORD@ or USER@ "
                "(percent-encode @ : / ? # % in them)"
            )
        user = unquote(raw_user)
        password = unquote(raw_password) if colon else None
    env = os.environ if env is None else env
    credentials = _credentials(user, password, options.get("password_file"), env, shown)
    endpoints = parse_etcd_endpoints(hosts)
    tls = _tls(parts.scheme, options, shown)
    return EtcdTarget(tuple(endpoints), parts.path.strip("/") or "aiobk", credentials, tls)


def open_store(uri: str, *, timeout: float = DEFAULT_TIMEOUT) -> MetadataStore:
    """A store for ``uri``. No I/O happens until the first call (etcd connects lazily, and
    a wrong password or an untrusted certificate shows there, as ``MetadataAuthError``)."""
    if uri.startswith("memory://"):
        name = uri[len("memory://") :].strip("/")
        if not name:
            raise MetadataURIError("memory:// needs a name, e.g. memory://test")
        return MetadataStore(MemoryKV.shared(name), "aiobk", uri)
    if uri.startswith(("etcd://", "etcds://")):
        from aiobk.metadata.kv_etcd import EtcdKV  # noqa: PLC0415 - grpc loads only for etcd URIs

        target = parse_etcd_uri(uri)
        kv = EtcdKV(list(target.endpoints), timeout, credentials=target.credentials, tls=target.tls)
        return MetadataStore(kv, target.prefix, redact_uri(uri))
    raise MetadataURIError(
        f"unsupported metadata URI {redact_uri(uri)!r}: use etcd://HOST:PORT/PREFIX, "
        "etcds://HOST:PORT/PREFIX or memory://NAME"
    )
