"""The master key a ledger's writer proves on every add and fence (derived from the password)."""

from __future__ import annotations

import hashlib

MASTER_KEY_SIZE = 32


def master_key(password: bytes) -> bytes:
    """Derive the 32-byte master key bookies compare; the password itself never travels."""
    return hashlib.sha256(b"aiobk-ledger\x00" + password).digest()
