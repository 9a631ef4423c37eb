"""A writer's per-entry work on an add, as one choice: compiled or pure Python.

Every append is an entry body encoded (the header, its CRC32C over header and payload, the
payload) and, under load, that body packed into one ADD_BATCH per bookie of its write set: a
few microseconds of Python per entry, most of a loaded client's codec time.
``aiobk.protocol._adds`` (Cython, built by ``pip install`` where a C compiler is found) does
both in C, one allocation each; the pure-Python functions stay the reference and the fallback:

- ``encode_entry`` -- ``pure_encode_entry`` below (``aiobk.protocol.entry``'s layout);
- ``pack_bodies`` -- ``aiobk.protocol.batch.pack_bodies``.

The compiled ones are used when the extension imports and the environment variable
``AIOBK_NO_EXTENSIONS`` is not ``1`` (read once, at import: set it before the process starts);
``COMPILED`` says which. Both give the same bytes and the same errors (the tests run one set of
cases through both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import crc32c

from aiobk.extensions import compiled
from aiobk.protocol import batch
from aiobk.protocol.entry import DigestType, pack_header


def pure_encode_entry(
    ledger_id: int, entry_id: int, lac: int, length: int, kind: DigestType, payload: bytes
) -> bytes | None:
    """The body of an entry of digest type ``kind`` (``CRC32C`` or ``DUMMY``): header, digest,
    payload; None for a digest that needs a key (a ``MAC``: ``client.digest`` computes it)."""
    if kind is not DigestType.CRC32C and kind is not DigestType.DUMMY:
        return None
    header = pack_header(ledger_id, entry_id, lac, length, kind)
    if kind is DigestType.DUMMY:
        return b"".join((header, payload))
    digest = crc32c.crc32c(payload, crc32c.crc32c(header)).to_bytes(4, "big")
    return b"".join((header, digest, payload))


_module = compiled("aiobk.protocol._adds")

COMPILED = _module is not None
"""Whether the compiled module is in use."""

encode_entry: Callable[[int, int, int, int, DigestType, bytes], bytes | None] = (
    _module.encode_entry if _module is not None else pure_encode_entry
)
"""``encode_entry(ledger_id, entry_id, lac, length, kind, payload)``: see
``pure_encode_entry``."""

pack_bodies: Callable[[Sequence[bytes]], bytes] = (
    _module.pack_bodies if _module is not None else batch.pack_bodies
)
"""``pack_bodies(bodies)``: the ``bodies`` field of an AddBatchRequest
(``aiobk.protocol.batch.pack_bodies``)."""

__all__ = ["COMPILED", "encode_entry", "pack_bodies", "pure_encode_entry"]
