"""Who a peer is, as a bookie sees it: the roles a verified TLS client certificate names.

A bookie with ``tls_client_auth`` reads a peer's roles from its certificate's subject, one role
per organizational unit (OU) attribute, as BookKeeper's ``authorizedRoles`` does. A peer without
a verified certificate has no role (``NO_ROLES``).
"""

from __future__ import annotations

ADMIN = "admin"  # operators: GC, state changes, bookie info, decommission, autorecovery control
BOOKIE = "bookie"  # bookie-to-bookie traffic: repair, re-replication, LEDGER_KEY
CLIENT = "client"  # applications: data (adds, reads, fencing, LAC, FORCE)

KNOWN_ROLES = frozenset({ADMIN, BOOKIE, CLIENT})
NO_ROLES: frozenset[str] = frozenset()

__all__ = ["ADMIN", "BOOKIE", "CLIENT", "KNOWN_ROLES", "NO_ROLES"]
