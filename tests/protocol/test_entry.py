from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.protocol import (
    HEADER_SIZE,
    DigestType,
    MalformedEntryError,
    key_request_proof,
    master_key,
    pack_entry,
    pack_header,
    parse_entry,
    peek_header,
)

i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(i64, i64, i64, i64, st.sampled_from(list(DigestType)), st.binary(max_size=100))
def test_entry_round_trip(
    ledger: int, entry: int, lac: int, length: int, kind: DigestType, payload: bytes
) -> None:
    header = pack_header(ledger, entry, lac, length, kind)
    digest = bytes(range(kind.size))
    body = pack_entry(header, digest, payload)
    assert peek_header(body) == (ledger, entry, lac)
    parsed = parse_entry(body)
    assert (parsed.ledger_id, parsed.entry_id, parsed.lac, parsed.length) == (
        ledger,
        entry,
        lac,
        length,
    )
    assert parsed.digest == digest
    assert parsed.payload == payload
    assert parsed.signed_part == header


def test_bad_bodies() -> None:
    with pytest.raises(MalformedEntryError, match="shorter than its header"):
        peek_header(b"\x01")
    header = bytearray(pack_header(1, 2, 3, 4, DigestType.CRC32C))
    with pytest.raises(MalformedEntryError, match="shorter than its digest"):
        peek_header(bytes(header))
    header[0] = 9
    with pytest.raises(MalformedEntryError, match="version 9"):
        peek_header(bytes(header) + b"1234")
    header[0] = 1
    header[1] = 77
    with pytest.raises(MalformedEntryError, match="digest type 77"):
        parse_entry(bytes(header) + b"1234")
    assert HEADER_SIZE == 34


@given(st.binary(max_size=80))
def test_garbage_bodies(data: bytes) -> None:
    with contextlib.suppress(MalformedEntryError):
        parse_entry(data)


def test_master_key_depends_on_password() -> None:
    assert master_key(b"a") != master_key(b"b")
    assert len(master_key(b"")) == 32


def test_a_key_request_proof_binds_the_secret_and_the_ledger() -> None:
    proof = key_request_proof(b"s" * 32, 7)
    assert len(proof) == 32
    assert proof == key_request_proof(b"s" * 32, 7)
    assert proof != key_request_proof(b"t" * 32, 7)
    assert proof != key_request_proof(b"s" * 32, 8)
