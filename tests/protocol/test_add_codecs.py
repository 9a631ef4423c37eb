"""A writer's per-entry work (protocol/_adds.pyx): the compiled entry encoding and batch packing
give the pure functions' bytes for every input the writer passes, and leave any other input to
them, so that it fails the same way (``protocol.add_codecs`` chooses)."""

from __future__ import annotations

import hashlib
import hmac
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.protocol import DigestType, EntryBody, add_codecs, pack_bodies, parse_entry
from aiobk.protocol.entry import HEADER_SIZE
from tests.support.choosers import check_chooser

# The compiled module whatever AIOBK_NO_EXTENSIONS says: ``make setup`` builds it, and these
# tests hold it to the pure functions.
compiled: ModuleType = importlib.import_module("aiobk.protocol._adds")

INT64 = st.integers(-(2**63), 2**63 - 1)
KINDS = st.sampled_from([DigestType.CRC32C, DigestType.DUMMY])


@given(INT64, INT64, INT64, INT64, KINDS, st.binary(max_size=3000))
def test_an_entry_encodes_to_the_same_bytes_on_both_paths(
    ledger_id: int, entry_id: int, lac: int, length: int, kind: DigestType, payload: bytes
) -> None:
    body = compiled.encode_entry(ledger_id, entry_id, lac, length, kind, payload)
    assert body == add_codecs.pure_encode_entry(ledger_id, entry_id, lac, length, kind, payload)
    digest = b""
    if kind is DigestType.CRC32C:  # over the header, then the payload
        digest = crc32c.crc32c(payload, crc32c.crc32c(body[:HEADER_SIZE])).to_bytes(4, "big")
    expected = EntryBody(ledger_id, entry_id, lac, length, kind, digest, payload)
    assert parse_entry(body) == expected


def test_a_mac_is_left_to_the_digester_on_both_paths() -> None:
    for encode in (compiled.encode_entry, add_codecs.pure_encode_entry):
        assert encode(7, 1, 0, 3, DigestType.MAC, b"abc") is None


@pytest.mark.parametrize(
    "args",
    [
        (2**63, 1, 0, 3, DigestType.CRC32C, b"abc"),  # an id out of range
        (7, -(2**63) - 1, 0, 3, DigestType.DUMMY, b"abc"),
        (7, 1, 0, 2**64, DigestType.CRC32C, b"abc"),
        (7.0, 1, 0, 3, DigestType.CRC32C, b"abc"),  # not an int
        (True, 1, 0, 3, DigestType.CRC32C, b"abc"),  # an int subclass: the pure path decides
        (7, 1, 0, 3, DigestType.CRC32C, "abc"),  # not bytes
        (7, 1, 0, 3, DigestType.CRC32C, None),
    ],
)
def test_odd_input_fails_or_passes_exactly_as_the_pure_function(args: tuple[Any, ...]) -> None:
    assert _outcome(compiled.encode_entry, args) == _outcome(add_codecs.pure_encode_entry, args)


@pytest.mark.parametrize(
    "payload", [bytearray(b"abc"), memoryview(b"abc")], ids=["bytearray", "memoryview"]
)
@pytest.mark.parametrize("kind", [DigestType.CRC32C, DigestType.DUMMY, 1, 0], ids=str)
def test_other_buffers_and_plain_ints_take_the_pure_path(payload: Any, kind: Any) -> None:
    args = (7, 1, 0, 3, kind, payload)
    assert _outcome(compiled.encode_entry, args) == _outcome(add_codecs.pure_encode_entry, args)


@given(st.lists(st.binary(max_size=2000), max_size=40), st.booleans())
def test_bodies_pack_to_the_same_bytes_on_both_paths(bodies: list[bytes], as_tuple: bool) -> None:
    given_bodies = tuple(bodies) if as_tuple else bodies
    packed = compiled.pack_bodies(given_bodies)
    assert packed == pack_bodies(bodies)
    assert len(packed) == sum(4 + len(body) for body in bodies)


@pytest.mark.parametrize(
    "make",
    [
        lambda: [b"ab", bytearray(b"cd")],  # not all bytes
        lambda: [b"ab", "cd"],
        lambda: (body for body in [b"ab", b"cd"]),  # not a list or tuple
        lambda: None,
        lambda: [b"ab", None],
    ],
    ids=["bytearray", "str", "generator", "none", "none-inside"],
)
def test_odd_batches_fail_or_pass_exactly_as_the_pure_function(make: Callable[[], Any]) -> None:
    assert _outcome(compiled.pack_bodies, make()) == _outcome(pack_bodies, make())


def test_the_digester_encodes_every_digest_type_as_before() -> None:
    from aiobk.client.digest import Digester  # the writer of every body

    payload = b"payload" * 100
    for kind in DigestType:
        digester = Digester(kind, b"password")
        body = digester.encode(7, 5, 4, 900, payload)
        header = body[:HEADER_SIZE]
        assert digester.verify(parse_entry(body), 7, 5) == payload
        if kind is DigestType.MAC:
            key = hashlib.sha256(b"aiobk-mac\x00password").digest()
            mac = hmac.new(key, header + payload, hashlib.sha256).digest()
            assert body == header + mac + payload


def _outcome(function: Callable[..., Any], args: Any) -> tuple[str, Any]:
    try:
        result = function(*args) if isinstance(args, tuple) else function(args)
    except Exception as exc:  # the type and message must agree
        return type(exc).__name__, str(exc)
    return "ok", result


def test_the_chooser_uses_the_compiled_module_unless_told_or_unable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (add_codecs.encode_entry is compiled.encode_entry) == add_codecs.COMPILED
    assert (add_codecs.pack_bodies is compiled.pack_bodies) == add_codecs.COMPILED
    pure = check_chooser(monkeypatch, add_codecs, "encode_entry", compiled.encode_entry)
    assert getattr(pure, "__name__", None) == "pure_encode_entry"
    check_chooser(monkeypatch, add_codecs, "pack_bodies", compiled.pack_bodies)
