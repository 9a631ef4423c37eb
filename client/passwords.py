"""A ledger's password as the metadata keeps it, and the checks made against it.

The metadata never holds the password: it holds a digest of the ledger's master key salted per
ledger (``protocol.keys.key_digest``), which bookies can check a key against; metadata written
before ledgers had a salt keeps the unsalted digest of the password, which is still read.
"""

from __future__ import annotations

from aiobk.metadata import LedgerMetadata
from aiobk.protocol import master_key
from aiobk.protocol.errors import UnauthorizedError
from aiobk.protocol.keys import key_digest, legacy_password_digest, password_matches


def password_digest(password: bytes, salt: bytes = b"") -> bytes:
    """What the metadata keeps to check a password (never the password itself): with a salt
    (every ledger created now), the salted digest of its master key, which bookies
    can check a key against too; without, the legacy unsalted digest of the password."""
    if salt:
        return key_digest(salt, master_key(password))
    return legacy_password_digest(password)


def check_password(ledger_id: int, metadata: LedgerMetadata, password: bytes) -> None:
    """UnauthorizedError unless ``password`` is the ledger's (compared in constant time); reads
    both the salted form and the legacy one (metadata written before the salt)."""
    if not password_matches(metadata.password_salt, metadata.password_digest, password):
        raise UnauthorizedError(f"wrong password for ledger {ledger_id}")


def check_delete(ledger_id: int, metadata: LedgerMetadata, password: bytes | None) -> None:
    """What deleting a ledger asks: its password, checked against the digest in
    its metadata; ``None`` stands for the empty password, so a ledger created without one
    needs none and any other is refused with a message saying what to pass."""
    if password is None:
        if not password_matches(metadata.password_salt, metadata.password_digest, b""):
            raise UnauthorizedError(
                f"ledger {ledger_id} has a password: deleting it takes the password (or, for "
                "an operator, force=True / --no-password-check)"
            )
        return
    check_password(ledger_id, metadata, password)


__all__ = ["check_delete", "check_password", "password_digest"]
