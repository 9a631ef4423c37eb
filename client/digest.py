"""Entry digests, computed by the writer and checked by every reader (docs/design/protocol.md).

CRC32C (hardware) by default; MAC is HMAC-SHA256 keyed by the ledger password, which also
proves the writer knew it; DUMMY skips the digest.
"""

from __future__ import annotations

import hashlib
import hmac

import crc32c

from aiobk.protocol import (
    HEADER_SIZE,
    DigestType,
    EntryBody,
    MalformedEntryError,
    pack_entry,
    pack_header,
    peek_header,
)
from aiobk.protocol.add_codecs import encode_entry
from aiobk.protocol.errors import DigestMismatchError


class Digester:
    """Computes and checks the digest every entry carries: CRC32C (corruption), HMAC-SHA256
    keyed by the ledger's password (``MAC``: forgery too), or none (``DUMMY``).

    Args:
        kind: The digest type.
        password: The ledger's password (the key of a ``MAC`` digest).
    """

    __slots__ = ("_key", "kind")

    def __init__(self, kind: DigestType, password: bytes = b"") -> None:
        self.kind = kind
        self._key = hashlib.sha256(b"aiobk-mac\x00" + password).digest()

    def digest(self, header: bytes, payload: bytes) -> bytes:
        """The digest of an entry's header and payload (empty for ``DUMMY``)."""
        kind = self.kind
        if kind is DigestType.CRC32C:
            return crc32c.crc32c(payload, crc32c.crc32c(header)).to_bytes(4, "big")
        if kind is DigestType.MAC:
            mac = hmac.new(self._key, header, hashlib.sha256)
            mac.update(payload)
            return mac.digest()
        return b""

    def encode(self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        """The entry body to send in an add."""
        body = encode_entry(ledger_id, entry_id, lac, length, self.kind, payload)
        if body is not None:  # CRC32C or DUMMY: in one pass, compiled where it is built
            return body
        header = pack_header(ledger_id, entry_id, lac, length, self.kind)
        return pack_entry(header, self.digest(header, payload), payload)

    def verify(self, entry: EntryBody, ledger_id: int, entry_id: int) -> bytes:
        """The payload of a parsed entry, or DigestMismatchError if anything is off."""
        self._check_ids(entry, ledger_id, entry_id)
        expected = self.digest(entry.signed_part, entry.payload)
        if not hmac.compare_digest(expected, entry.digest):
            raise DigestMismatchError(f"digest mismatch on entry {ledger_id}/{entry_id}")
        return entry.payload

    def checks_digest(self) -> bool:
        """Whether ``check_body`` checks an entry's digest, not only its ids and digest type."""
        return True

    def check_body(self, body: bytes, ledger_id: int, entry_id: int) -> None:
        """``verify``'s checks on an entry body as served, left whole: a copier keeps the
        bytes, so nothing is parsed out or packed again. DigestMismatchError if anything is
        off (a body that does not parse too)."""
        self._check_raw_ids(body, ledger_id, entry_id)
        kind = self.kind
        view = memoryview(body)
        if kind is DigestType.CRC32C:
            end = HEADER_SIZE + 4
            crc = crc32c.crc32c(view[end:], crc32c.crc32c(view[:HEADER_SIZE]))
            if crc != int.from_bytes(view[HEADER_SIZE:end], "big"):
                raise DigestMismatchError(f"digest mismatch on entry {ledger_id}/{entry_id}")
        elif kind is DigestType.MAC:
            end = HEADER_SIZE + kind.size
            mac = hmac.new(self._key, view[:HEADER_SIZE], hashlib.sha256)
            mac.update(view[end:])
            if not hmac.compare_digest(mac.digest(), view[HEADER_SIZE:end]):
                raise DigestMismatchError(f"digest mismatch on entry {ledger_id}/{entry_id}")

    def _check_raw_ids(self, body: bytes, ledger_id: int, entry_id: int) -> None:
        try:
            stored_ledger, stored_entry, _lac = peek_header(body)
        except MalformedEntryError as exc:
            raise DigestMismatchError(f"entry {ledger_id}/{entry_id}: {exc}") from None
        if stored_ledger != ledger_id or stored_entry != entry_id:
            raise DigestMismatchError(
                f"bookie returned {stored_ledger}/{stored_entry} for {ledger_id}/{entry_id}"
            )
        if body[1] != self.kind:
            raise DigestMismatchError(
                f"entry {ledger_id}/{entry_id} has digest {DigestType(body[1]).name}, "
                f"ledger uses {self.kind.name}"
            )

    def _check_ids(self, entry: EntryBody, ledger_id: int, entry_id: int) -> None:
        if entry.ledger_id != ledger_id or entry.entry_id != entry_id:
            raise DigestMismatchError(
                f"bookie returned {entry.ledger_id}/{entry.entry_id} for {ledger_id}/{entry_id}"
            )
        if entry.digest_type is not self.kind:
            raise DigestMismatchError(
                f"entry {ledger_id}/{entry_id} has digest {entry.digest_type.name}, "
                f"ledger uses {self.kind.name}"
            )


class CopyChecker(Digester):
    """What a copier without the ledger's password can check of an entry: its ids and digest
    type always, its digest unless that is a MAC (keyed by the password the copier lacks).

    An offload of a MAC ledger copies entries so checked; a reader of the copy, holding the
    password, checks each MAC as it checks a bookie's copy."""

    __slots__ = ()

    def verify(self, entry: EntryBody, ledger_id: int, entry_id: int) -> bytes:
        if self.kind is not DigestType.MAC:
            return super().verify(entry, ledger_id, entry_id)
        self._check_ids(entry, ledger_id, entry_id)
        return entry.payload

    def checks_digest(self) -> bool:
        return self.kind is not DigestType.MAC

    def check_body(self, body: bytes, ledger_id: int, entry_id: int) -> None:
        if self.kind is not DigestType.MAC:
            super().check_body(body, ledger_id, entry_id)
        else:
            self._check_raw_ids(body, ledger_id, entry_id)
