"""A client's TLS context from PEM files: what the CLI's ``--tls-ca/--tls-cert/--tls-key``
(or ``AIOBK_TLS_CA``, ``AIOBK_TLS_CERT``, ``AIOBK_TLS_KEY``) and the Spark source's
``tlsCa/tlsCert/tlsKey`` options name. Any one of them makes every bookie connection TLS:
the bookies' certificates must chain to the CA (the system's when none is given), the client's
certificate, if given, is its identity and roles."""

from __future__ import annotations

import os
import ssl
from typing import Final

TLS_ENV: Final = {"ca": "AIOBK_TLS_CA", "cert": "AIOBK_TLS_CERT", "key": "AIOBK_TLS_KEY"}


class TlsFilesError(ValueError):
    """TLS files that cannot be used, named with the reason (never their contents)."""


def client_context(
    ca: str | None = None, cert: str | None = None, key: str | None = None
) -> ssl.SSLContext | None:
    """The context for bookie connections these files ask for; None when none is given."""
    if not (ca or cert or key):
        return None
    if key and not cert:
        raise TlsFilesError("a TLS key needs its certificate")
    for path in (ca, cert, key):
        if path and not os.path.isfile(path):
            raise TlsFilesError(f"TLS file {path} does not exist")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert:
            context.load_cert_chain(cert, key or None)
    except (ssl.SSLError, OSError) as exc:
        files = ", ".join(f for f in (ca, cert, key) if f)
        raise TlsFilesError(f"TLS files {files} cannot be used: {exc}") from None
    return context


def from_environment() -> dict[str, str]:
    """The ``AIOBK_TLS_*`` files set in the environment, by kind (ca, cert, key)."""
    return {kind: os.environ[env] for kind, env in TLS_ENV.items() if os.environ.get(env)}


__all__ = ["TLS_ENV", "TlsFilesError", "client_context", "from_environment"]
