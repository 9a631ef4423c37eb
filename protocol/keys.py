"""The master key a ledger's writer proves on every add and fence (derived from the password)."""

from __future__ import annotations

import hashlib
import hmac

MASTER_KEY_SIZE = 32


def master_key(password: bytes) -> bytes:
    """Derive the 32-byte master key bookies compare; the password itself never travels."""
    return hashlib.sha256(b"aiobk-ledger\x00" + password).digest()


def key_request_proof(secret: bytes, ledger_id: int) -> bytes:
    """What a LEDGER_KEY request carries: an HMAC of the ledger id under the cluster's secret
    (kept in the metadata store), so a peer that only reaches the bookie port cannot collect
    master keys. Compare with ``hmac.compare_digest``."""
    message = b"aiobk-key-request\x00" + ledger_id.to_bytes(8, "big", signed=True)
    return hmac.new(secret, message, hashlib.sha256).digest()
