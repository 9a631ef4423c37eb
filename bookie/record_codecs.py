"""The bookie's per-entry work on an ADD_BATCH and a range read, as one choice: compiled or
pure Python.

An ADD_BATCH of hundreds of entries is, per entry, a body unpacked and checked, a journal ADD
record and an entry-log record, each record with its CRC32C: tight loops that are most of a
loaded bookie's Python time. ``aiobk.bookie._records`` (Cython, built by ``pip install`` where
a C compiler is found) does them in C; the pure-Python functions stay the reference and the
fallback:

- ``unpack_bodies`` -- ``aiobk.protocol.batch.unpack_bodies``;
- ``encode_adds`` -- ``aiobk.bookie.journal.format.encode_adds``;
- ``pack_records`` -- ``aiobk.bookie.entrylog.format.pack_records``;
- ``check_records`` and ``run_end`` -- a range read's run of records found and checked
  (``aiobk.bookie.entrylog.format``).

The compiled ones are used when the extension imports and the environment variable
``AIOBK_NO_EXTENSIONS`` is not ``1`` (read once, at import: set it before the process starts);
``COMPILED`` says which. Both give the same bytes and the same errors (the tests run one set of
cases through both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiobk.bookie.entrylog import format as log_format
from aiobk.bookie.journal import format as journal_format
from aiobk.extensions import compiled
from aiobk.protocol import batch

_module = compiled("aiobk.bookie._records")

COMPILED = _module is not None

unpack_bodies: Callable[[bytes, int], list[tuple[int, int, bytes]]] = (
    _module.unpack_bodies if _module is not None else batch.unpack_bodies
)
encode_adds: Callable[[int, int, Sequence[tuple[int, bytes]]], bytes] = (
    _module.encode_adds if _module is not None else journal_format.encode_adds
)
pack_records: Callable[
    [bytearray, int, int, int, int, Sequence[tuple[int, bytes]], int, list[int]], int
] = _module.pack_records if _module is not None else log_format.pack_records

check_records: Callable[[bytes, int, int, Sequence[tuple[int, int]]], list[bytes] | None] = (
    _module.check_records if _module is not None else log_format.check_records
)
run_end: Callable[[Sequence[tuple[int, int]], int, int], int] = (
    _module.run_end if _module is not None else log_format.run_end
)

__all__ = [
    "COMPILED",
    "check_records",
    "encode_adds",
    "pack_records",
    "run_end",
    "unpack_bodies",
]
