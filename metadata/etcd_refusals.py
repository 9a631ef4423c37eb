"""What etcd's refusals and gRPC's connection failures mean, in one line a reader can act on.

gRPC reports a failed connection as a transcript ("failed to connect to all addresses; last
error: UNKNOWN: ipv4:...: ..."), and etcd refuses wrong credentials, missing permissions and
untrusted certificates in its own words: these name the cause and the remedy, and never echo a
password (etcd's messages never hold one).
"""

from __future__ import annotations

from aiobk.metadata.kv import EtcdCredentials, EtcdTLS, MetadataAuthError, MetadataPermissionError
from aiobk.protocol.errors import MetadataStoreError

# gRPC's words for a connection that could not be made, and what they mean to a reader.
_UNREACHABLE = (
    ("connection refused", "connection refused (is etcd running on that port?)"),
    ("domain name not found", "the host name does not resolve"),
    ("name or service not known", "the host name does not resolve"),
    ("dns resolution failed", "the host name does not resolve"),
    ("no route to host", "no route to the host"),
    ("network is unreachable", "the network is unreachable"),
    ("connection reset", "the connection was reset"),
    ("socket closed", "the connection was closed"),
    ("timed out", "the connection timed out"),
    ("deadline exceeded", "the connection timed out"),
)
_LONGEST_REASON = 300  # characters of an unknown cause kept in a message


def one_line(exc: BaseException | None) -> str:
    """``exc``'s text on one line (gRPC's can span several), cut to a readable length."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _LONGEST_REASON else text[: _LONGEST_REASON - 3] + "..."


def unreachable_reason(exc: BaseException | None) -> str:
    """Why a connection to etcd failed, in a few words rather than gRPC's transcript
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:...: ...")."""
    low = str(exc).lower()
    for words, reason in _UNREACHABLE:
        if words in low:
            return reason
    return one_line(exc)


class Refusals:
    """The errors of one ``EtcdKV``: its user and TLS settings are part of what they say."""

    def __init__(self, credentials: EtcdCredentials | None, tls: EtcdTLS | None) -> None:
        self.credentials = credentials
        self.tls = tls

    def refused(self, endpoint: str, what: str, exc: BaseException) -> MetadataAuthError | None:
        """The auth error ``exc`` stands for, if it says the credentials are wrong."""
        text = str(exc)
        if "authentication failed" in text:
            user = self.credentials.user if self.credentials is not None else ""
            return MetadataAuthError(
                f"etcd {endpoint}: authentication failed for user {user!r} "
                "(wrong user name or password)"
            )
        if "user name is empty" in text:
            return MetadataAuthError(
                f"etcd {endpoint}: {what} refused: {text} (this etcd has auth enabled: name a "
                "user, as USER:PASSWORD@ in the URI or AIOBK_ETCD_USER/AIOBK_ETCD_PASSWORD)"
            )
        return None

    def denied(self, endpoint: str, what: str, key: bytes | None) -> MetadataPermissionError:
        who = (
            f"user {self.credentials.user!r}"
            if self.credentials is not None
            else "this client (no user given: etcd takes a client certificate's common name)"
        )
        where = f" on {key.decode(errors='replace')!r}" if key is not None else ""
        return MetadataPermissionError(
            f"etcd {endpoint}: permission denied to {who} for {what}{where}: its roles must "
            "grant readwrite on the store's whole /PREFIX/ key range"
        )

    def tls_refusal(self, endpoint: str, exc: BaseException) -> MetadataAuthError | None:
        """What a TLS handshake that failed for certain says (gRPC's words in ``exc``), or None
        for failures an outage can also cause (a connection cut mid-handshake)."""
        if self.tls is None:
            return None
        text = " ".join(str(exc).split())
        low = text.lower()
        host = endpoint.rpartition(":")[0]
        if "certificate_verify_failed" in low:
            detail = text.rpartition("CERTIFICATE_VERIFY_FAILED:")[2].strip().removesuffix(": OK")
            ca = self.tls.ca or "the system's CAs"
            why = f"etcd's certificate is not signed by {ca} ({detail or 'verify failed'})"
        elif "hostname verification" in low:
            why = f"etcd's certificate does not name {host}"
        elif "tsi_data_corrupted" in low:  # TLS 1.3: the server's alert comes after the hello
            why = (
                f"etcd did not accept the client certificate {self.tls.cert}"
                if self.tls.cert is not None
                else "etcd requires a client certificate (?cert=PATH&key=PATH)"
            )
        elif "wrong_version_number" in low:
            why = "no TLS on that port (etcd:// for a plaintext etcd)"
        else:
            return None
        return MetadataAuthError(f"etcd {endpoint}: TLS handshake failed: {why}")

    def unreachable(
        self, description: str, what: str, last: BaseException | None
    ) -> MetadataStoreError:
        """No endpoint answered ``what``: why the last one failed, with a hint where the
        failure looks like TLS on one side only."""
        hint, text = "", str(last).lower()
        if self.tls is None and "socket closed" in text:
            hint = " (if this etcd serves TLS: etcds://, and ?ca=PATH for a private CA)"
        elif self.tls is not None and "handshake read failed" in text:
            hint = " (the TLS handshake was cut short: does this etcd serve TLS?)"
        return MetadataStoreError(
            f"{description} is unreachable ({what}): {unreachable_reason(last)}{hint}"
        )
