"""The master key a ledger's writer proves on every add and fence (derived from the password),
and what the metadata keeps to check it.

- ``master_key(password)``: the 32 bytes bookies compare; the password itself never travels.
- ``key_digest(salt, key)``: what a ledger's metadata keeps -- a digest of the *master key*,
  salted per ledger (``password_salt``, 16 random bytes the creating client draws). A bookie,
  which only ever sees the master key, can check it against the metadata before it lets a
  request create its state for a ledger it does not hold yet; an attacker who reads the metadata
  cannot test a password list against every ledger at once.
- ``legacy_password_digest(password)``: the unsalted digest of the password, which metadata
  written before ledgers had a salt keeps (no ``password_salt``). A client still checks a
  password against it; a bookie cannot (it has the key, not the password), so for such a ledger
  it only checks that the ledger exists.
- ``key_request_proof`` and ``stand_in_key``: what a replication worker proves with the
  cluster's secret (kept in the metadata store).
"""

from __future__ import annotations

import hashlib
import hmac

MASTER_KEY_SIZE = 32
SALT_SIZE = 16  # bytes of per-ledger salt a client draws for ``key_digest``


def master_key(password: bytes) -> bytes:
    """Derive the 32-byte master key bookies compare; the password itself never travels."""
    return hashlib.sha256(b"aiobk-ledger\x00" + password).digest()


def key_digest(salt: bytes, key: bytes) -> bytes:
    """The salted digest of a master key that ledger metadata keeps (``password_digest`` when
    ``password_salt`` is set). Compare with ``hmac.compare_digest``."""
    return hashlib.sha256(b"aiobk-key-digest\x00" + salt + key).digest()


def legacy_password_digest(password: bytes) -> bytes:
    """The unsalted password digest of metadata written before ledgers had a salt."""
    return hashlib.sha256(b"aiobk-password\x00" + password).digest()


def password_matches(salt: bytes, digest: bytes, password: bytes) -> bool:
    """Whether ``password`` is the one whose digest the metadata keeps: the salted digest of
    its master key when there is a salt, else the legacy unsalted form (constant time)."""
    if salt:
        return hmac.compare_digest(digest, key_digest(salt, master_key(password)))
    return hmac.compare_digest(digest, legacy_password_digest(password))


def key_matches(salt: bytes, digest: bytes, key: bytes) -> bool | None:
    """Whether master ``key`` is the one the metadata's digest was made from; None when the
    metadata is of the legacy form (no salt), which a key cannot be checked against."""
    if not salt:
        return None
    return hmac.compare_digest(digest, key_digest(salt, key))


def key_request_proof(secret: bytes, ledger_id: int) -> bytes:
    """What a LEDGER_KEY request carries: an HMAC of the ledger id under the cluster's secret
    (kept in the metadata store), so a peer that only reaches the bookie port cannot collect
    master keys. Compare with ``hmac.compare_digest``."""
    message = b"aiobk-key-request\x00" + ledger_id.to_bytes(8, "big", signed=True)
    return hmac.new(secret, message, hashlib.sha256).digest()


def stand_in_key(secret: bytes, ledger_id: int) -> bytes:
    """The key a replication worker fences an open ledger with when no bookie left ever held
    it, so nobody knows its key (``autorecovery.worker``): an HMAC of the ledger id under the
    cluster's secret, which a bookie that does not hold the ledger accepts on a fencing read in
    place of the key the metadata's digest names -- only a holder of the secret can make it."""
    message = b"aiobk-stand-in-key\x00" + ledger_id.to_bytes(8, "big", signed=True)
    return hmac.new(secret, message, hashlib.sha256).digest()


__all__ = [
    "MASTER_KEY_SIZE",
    "SALT_SIZE",
    "key_digest",
    "key_matches",
    "key_request_proof",
    "legacy_password_digest",
    "master_key",
    "password_matches",
    "stand_in_key",
]
