"""The entries of an ADD_BATCH (protocol 2): packing and the checks on unpacking. Pure.

An ``AddBatchRequest`` carries entry bodies (``protocol.entry``) back to back, each after its
length as 4 bytes big-endian: one bytes field, so a batch of hundreds of entries costs the
msgpack decoder one value, not hundreds (and the decoder's array limit stays small). A batch
holds 1 to ``MAX_BATCH_ENTRIES`` entries of one ledger in strictly increasing entry id order,
each with a header that parses; anything else refuses the whole batch (EBADREQ), since its
answer names entries by their place in it.

``AddBatchResponse.statuses`` is empty when every entry is EOK, else one status byte per entry
(``pack_statuses`` / ``unpack_statuses``).

A ``ReadRangeResponse`` carries its entries packed the same way; ``unpack_range`` also checks
that they are consecutive from the first entry asked and end within the range asked.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from aiobk.protocol.entry import HEADER_SIZE, MalformedEntryError, peek_header
from aiobk.protocol.limits import MAX_ENTRY_ID
from aiobk.protocol.status import StatusCode

MAX_BATCH_ENTRIES = 1024  # entries one ADD_BATCH may carry (a bookie refuses more)
_LENGTH = struct.Struct(">I")
_LENGTH_SIZE = _LENGTH.size
_STATUS = {int(code): code for code in StatusCode}


class BatchError(ValueError):
    """Bodies that are not a valid batch (the reason says why)."""


def pack_bodies(bodies: Sequence[bytes]) -> bytes:
    """The ``bodies`` field of an AddBatchRequest."""
    pack = _LENGTH.pack
    parts: list[bytes] = []
    append = parts.append
    for body in bodies:
        append(pack(len(body)))
        append(body)
    return b"".join(parts)


def unpack_bodies(packed: bytes, ledger_id: int) -> list[tuple[int, int, bytes]]:
    """``(entry id, piggybacked LAC, body)`` of each entry of a batch of ``ledger_id``, checked
    as the module docstring says (each header by ``peek_header``); raises ``BatchError``."""
    entries: list[tuple[int, int, bytes]] = []
    unpack_length = _LENGTH.unpack_from
    end = len(packed)
    at = 0
    last = -1
    while at < end:
        if len(entries) == MAX_BATCH_ENTRIES:
            raise BatchError(f"more than {MAX_BATCH_ENTRIES} entries")
        if end - at < _LENGTH_SIZE:
            raise BatchError(f"a length cut short at byte {at}")
        (size,) = unpack_length(packed, at)
        at += _LENGTH_SIZE
        if size < HEADER_SIZE or size > end - at:
            raise BatchError(f"entry {len(entries)}: {size} bytes at byte {at} do not fit")
        body = packed[at : at + size]
        at += size
        try:
            body_ledger, entry_id, lac = peek_header(body)
        except MalformedEntryError as exc:
            raise BatchError(f"entry {len(entries)}: {exc}") from None
        if body_ledger != ledger_id:
            raise BatchError(f"entry {len(entries)} is of ledger {body_ledger}, not {ledger_id}")
        if entry_id <= last or entry_id > MAX_ENTRY_ID:
            raise BatchError(f"entry id {entry_id} after {last}: not increasing, or too large")
        last = entry_id
        entries.append((entry_id, lac, body))
    if not entries:
        raise BatchError("no entries")
    return entries


def pack_statuses(statuses: Sequence[StatusCode]) -> bytes:
    """``AddBatchResponse.statuses``: empty when all are EOK."""
    if all(status is StatusCode.EOK for status in statuses):
        return b""
    return bytes(int(status) for status in statuses)


def unpack_statuses(packed: bytes, count: int) -> list[StatusCode]:
    """Each of ``count`` entries' status; an unknown code reads as EIO (the entry is not
    acknowledged). Raises ``BatchError`` when the count is wrong."""
    if not packed:
        return [StatusCode.EOK] * count
    if len(packed) != count:
        raise BatchError(f"{len(packed)} statuses for {count} entries")
    return [_STATUS.get(code, StatusCode.EIO) for code in packed]


def unpack_range(packed: bytes, ledger_id: int, first: int, last: int) -> list[bytes]:
    """The bodies of a READ_RANGE answer for entries ``first``..``last`` of ``ledger_id``:
    at least one, each with a header that parses, consecutive from ``first``, none after
    ``last``; raises ``BatchError`` otherwise."""
    entries = unpack_bodies(packed, ledger_id)
    end = first + len(entries) - 1
    if entries[0][0] != first or entries[-1][0] != end or end > last:
        raise BatchError(
            f"entries {entries[0][0]}..{entries[-1][0]} ({len(entries)}) are not a run "
            f"from {first} within {first}..{last}"
        )
    return [body for _entry_id, _lac, body in entries]
