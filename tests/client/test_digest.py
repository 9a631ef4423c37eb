"""Checking an entry body as served (``Digester.check_body``) agrees with parsing it and checking
the parsed entry (``parse_entry`` then ``verify``): the same bodies pass, the same fail."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.client.digest import CopyChecker, Digester
from aiobk.protocol import HEADER_SIZE, DigestType, MalformedEntryError, parse_entry
from aiobk.protocol.errors import DigestMismatchError

KINDS = list(DigestType)


def _parsed_verdict(checker: Digester, body: bytes, ledger_id: int, entry_id: int) -> bool:
    try:
        checker.verify(parse_entry(body), ledger_id, entry_id)
    except (MalformedEntryError, DigestMismatchError):
        return False
    return True


def _raw_verdict(checker: Digester, body: bytes, ledger_id: int, entry_id: int) -> bool:
    try:
        checker.check_body(body, ledger_id, entry_id)
    except DigestMismatchError:
        return False
    return True


@given(
    kind=st.sampled_from(KINDS),
    reader_kind=st.sampled_from(KINDS),
    payload=st.binary(max_size=64),
    flip=st.one_of(st.none(), st.integers(0, 200)),
    cut=st.one_of(st.none(), st.integers(0, 120)),
    asked=st.sampled_from([(5, 9), (5, 8), (6, 9)]),
    copier=st.booleans(),
    password=st.sampled_from([b"pw", b"other"]),
)
def test_a_body_checked_whole_passes_exactly_when_its_parsed_entry_does(
    kind: DigestType,
    reader_kind: DigestType,
    payload: bytes,
    flip: int | None,
    cut: int | None,
    asked: tuple[int, int],
    copier: bool,
    password: bytes,
) -> None:
    body = bytearray(Digester(kind, b"pw").encode(5, 9, 8, 100, payload))
    if flip is not None and flip < len(body):
        body[flip] ^= 0x41
    if cut is not None:
        del body[cut:]
    checker = CopyChecker(reader_kind) if copier else Digester(reader_kind, password)
    raw = bytes(body)
    assert _raw_verdict(checker, raw, *asked) == _parsed_verdict(checker, raw, *asked)


@pytest.mark.parametrize("kind", KINDS)
def test_a_good_body_passes_and_a_damaged_payload_does_not(kind: DigestType) -> None:
    digester = Digester(kind, b"pw")
    body = digester.encode(5, 9, 8, 100, b"payload")
    digester.check_body(body, 5, 9)
    damaged = body[:-1] + bytes([body[-1] ^ 1])
    if kind is DigestType.DUMMY:
        digester.check_body(damaged, 5, 9)  # nothing to check it by
    else:
        with pytest.raises(DigestMismatchError, match="digest mismatch on entry 5/9"):
            digester.check_body(damaged, 5, 9)


def test_a_copier_checks_a_mac_body_by_its_ids_only() -> None:
    body = Digester(DigestType.MAC, b"secret").encode(5, 9, 8, 100, b"payload")
    copier = CopyChecker(DigestType.MAC)
    copier.check_body(body[:-1] + b"X", 5, 9)  # the MAC needs the password it lacks
    with pytest.raises(DigestMismatchError, match="returned 5/9 for 5/10"):
        copier.check_body(body, 5, 10)
    with pytest.raises(DigestMismatchError, match="shorter than its header"):
        copier.check_body(body[: HEADER_SIZE - 1], 5, 9)
