"""The salted key digest the metadata keeps, the legacy form it still reads, and the
stand-in key of a replication worker -- pure functions."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.client.passwords import check_password, password_digest
from aiobk.metadata import Fragment, LedgerMetadata
from aiobk.protocol.errors import UnauthorizedError
from aiobk.protocol.keys import (
    MASTER_KEY_SIZE,
    SALT_SIZE,
    key_digest,
    key_matches,
    key_request_proof,
    legacy_password_digest,
    master_key,
    password_matches,
    stand_in_key,
)

SALT = bytes(range(SALT_SIZE))
pytestmark = pytest.mark.timeout(30)


def test_key_digest_is_of_the_master_key_salted() -> None:
    key = master_key(b"pw")
    assert len(key) == MASTER_KEY_SIZE
    digest = key_digest(SALT, key)
    assert digest == hashlib.sha256(b"aiobk-key-digest\x00" + SALT + key).digest()
    assert key_digest(b"\x01" * SALT_SIZE, key) != digest  # the salt matters
    assert key_digest(SALT, master_key(b"other")) != digest
    # Neither the password's legacy digest nor the bare key: a domain of its own.
    assert digest not in (legacy_password_digest(b"pw"), key, hashlib.sha256(key).digest())


def test_a_bookie_checks_a_key_a_client_checks_a_password() -> None:
    digest = key_digest(SALT, master_key(b"pw"))
    assert key_matches(SALT, digest, master_key(b"pw")) is True
    assert key_matches(SALT, digest, master_key(b"")) is False
    assert key_matches(SALT, digest, b"") is False
    assert password_matches(SALT, digest, b"pw")
    assert not password_matches(SALT, digest, b"pW")


def test_the_legacy_form_is_read_by_clients_and_cannot_be_checked_by_bookies() -> None:
    legacy = hashlib.sha256(b"aiobk-password\x00pw").digest()  # as written before the salt
    assert legacy_password_digest(b"pw") == legacy
    assert password_matches(b"", legacy, b"pw")
    assert not password_matches(b"", legacy, b"")
    assert key_matches(b"", legacy, master_key(b"pw")) is None  # only existence is checked
    assert password_digest(b"pw") == legacy
    assert password_digest(b"pw", SALT) == key_digest(SALT, master_key(b"pw"))


@given(st.binary(max_size=64), st.binary(min_size=SALT_SIZE, max_size=SALT_SIZE))
def test_password_matches_its_own_digest_only(password: bytes, salt: bytes) -> None:
    digest = password_digest(password, salt)
    assert password_matches(salt, digest, password)
    assert not password_matches(salt, digest, password + b"x")
    assert key_matches(salt, digest, master_key(password)) is True


def test_stand_in_key_needs_the_secret_and_names_the_ledger() -> None:
    key = stand_in_key(b"secret", 7)
    assert len(key) == 32
    assert key == stand_in_key(b"secret", 7)
    assert key != stand_in_key(b"secret", 8)
    assert key != stand_in_key(b"other", 7)
    assert key != key_request_proof(b"secret", 7)  # a key-request proof is not a stand-in


def _metadata(**fields: object) -> LedgerMetadata:
    return LedgerMetadata(3, 3, 2, (Fragment(0, ("a", "b", "c")),), **fields)  # type: ignore[arg-type]


def test_metadata_keeps_the_salt_and_round_trips() -> None:
    found = _metadata(
        password_digest=password_digest(b"pw", SALT), password_salt=SALT, creation_time=5
    )
    document = json.loads(found.to_json())
    assert "password_salt" in document
    again = LedgerMetadata.from_json(found.to_json())
    assert again == found
    assert again.password_salt == SALT
    check_password(1, again, b"pw")
    with pytest.raises(UnauthorizedError):
        check_password(1, again, b"nope")


def test_metadata_written_before_the_salt_reads_as_the_legacy_form() -> None:
    """The JSON of a ledger created before the salt: no ``password_salt`` field at all."""
    old = _metadata(password_digest=legacy_password_digest(b"pw"))
    document = json.loads(old.to_json())
    assert "password_salt" not in document  # written as before: readers before 18 read it
    document.pop("password_salt", None)
    read = LedgerMetadata.from_json(json.dumps(document).encode())
    assert read.password_salt == b""
    check_password(1, read, b"pw")
    with pytest.raises(UnauthorizedError):
        check_password(1, read, b"")
