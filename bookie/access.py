"""Who may ask what on a bookie connection (TLS and client roles): pure rules, no sockets.

A bookie with TLS set up (``tls_cert_file``) guards every connection:

- **A handshake first.** Before anything but HANDSHAKE and START_TLS, the peer must have
  stated its protocol version (BookKeeper's ``AuthHandler`` likewise holds every request
  until authentication is done). A peer that skips it is answered EPERM and disconnected.
- **TLS when required.** With ``tls_only``, a connection that has not upgraded (START_TLS)
  may send only START_TLS: anything else is answered EPERM and the connection closed.
- **Roles.** With ``tls_client_auth`` every peer has a verified certificate; its subject's
  OU attributes are its roles (BookKeeper's ``authorizedRoles`` reads the same field). Data
  requests need any role; operators' requests need ``admin``; a ledger's master key for
  re-replication needs ``bookie`` (or ``admin``: ``aiobk bookies decommission`` copies too).
  A request the roles do not cover is answered EPERM; the connection stays (the peer may
  still do what its roles allow). A connection without TLS has no certificate, so with
  ``tls_client_auth`` it may only handshake and upgrade.

Without TLS set up nothing is guarded: every peer may do anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiobk.protocol import ADMIN, BOOKIE, CLIENT, KNOWN_ROLES, NO_ROLES, OpCode

ANY_ROLE = frozenset({ADMIN, BOOKIE, CLIENT})
OP_ROLES: Mapping[OpCode, frozenset[str]] = {  # HANDSHAKE and START_TLS: anyone
    OpCode.ADD: ANY_ROLE,  # a worker's RECOVERY_ADD is an add too
    OpCode.ADD_BATCH: ANY_ROLE,
    OpCode.READ: ANY_ROLE,
    OpCode.READ_RANGE: ANY_ROLE,
    OpCode.READ_LAC: ANY_ROLE,
    OpCode.WRITE_LAC: ANY_ROLE,
    OpCode.FORCE: ANY_ROLE,
    OpCode.GET_BOOKIE_INFO: frozenset({ADMIN, BOOKIE}),
    OpCode.GC: frozenset({ADMIN}),
    OpCode.GC_REPORT: frozenset({ADMIN, BOOKIE}),
    OpCode.BOOKIE_STATE: frozenset({ADMIN, BOOKIE}),  # decommission sets a bookie read-only
    OpCode.LEDGER_KEY: frozenset({ADMIN, BOOKIE}),
}
UNGUARDED = frozenset({OpCode.HANDSHAKE, OpCode.START_TLS})


@dataclass(frozen=True, slots=True)
class Policy:
    """What the bookie's settings ask of its connections."""

    guarded: bool = False  # TLS set up: handshake first, and the two below
    tls_only: bool = False
    client_auth: bool = False  # roles enforced


OPEN = Policy()  # no TLS set up: nothing guarded


@dataclass(frozen=True, slots=True)
class Refusal:
    why: str
    close: bool  # the connection goes too (a protocol breach, not a missing role)


def check(
    policy: Policy, op: OpCode, *, tls: bool, handshaken: bool, roles: frozenset[str]
) -> Refusal | None:
    """None when a request ``op`` may be handled on a connection in this state."""
    if not policy.guarded:
        return None
    if policy.tls_only and not tls and op is not OpCode.START_TLS:
        return Refusal("this bookie takes TLS connections only (START_TLS first)", close=True)
    if op in UNGUARDED:
        return None
    if not handshaken:
        return Refusal(f"{op.name} before the handshake", close=True)
    if policy.client_auth and not roles & OP_ROLES[op]:
        have = ", ".join(sorted(roles)) or "none"
        need = " or ".join(sorted(OP_ROLES[op]))
        return Refusal(f"{op.name} needs the role {need} (the certificate has {have})", False)
    return None


def roles_of(peercert: Mapping[str, Any] | None) -> frozenset[str]:
    """The known roles a verified certificate names in its subject's OU attributes
    (``ssl.SSLSocket.getpeercert()``'s form: RDNs of (name, value) pairs)."""
    if not peercert:
        return NO_ROLES
    return frozenset(
        value
        for name, value in _attributes(peercert.get("subject", ()))
        if name == "organizationalUnitName" and value in KNOWN_ROLES
    )


def subject_name(peercert: Mapping[str, Any] | None) -> str:
    """The certificate's common name, for logs ("" without one)."""
    if not peercert:
        return ""
    names = [v for n, v in _attributes(peercert.get("subject", ())) if n == "commonName"]
    return names[0] if names else ""


def _attributes(subject: Iterable[Any]) -> list[tuple[str, str]]:
    return [
        (str(attribute[0]), str(attribute[1]))
        for rdn in subject
        for attribute in rdn
        if isinstance(attribute, tuple | list) and len(attribute) == 2
    ]
