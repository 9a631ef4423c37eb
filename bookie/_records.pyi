"""Types of the compiled record encoders (bookie/_records.pyx); ``aiobk.bookie.record_codecs``
chooses between them and the pure-Python ones."""

from collections.abc import Sequence

def encode_adds(first_lsn: int, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> bytes: ...
def pack_records(
    data: bytearray,
    start: int,
    max_size: int,
    location_base: int,
    ledger_id: int,
    entries: Sequence[tuple[int, bytes]],
    first: int,
    locations: list[int],
) -> int: ...
def unpack_bodies(packed: bytes, ledger_id: int) -> list[tuple[int, int, bytes]]: ...
def check_records(
    block: bytes, start: int, ledger_id: int, run: Sequence[tuple[int, int]]
) -> list[bytes] | None: ...
def run_end(wanted: Sequence[tuple[int, int]], at: int, limit: int) -> int: ...
def crc32c(data: bytes, value: int = 0, portable: bool = False) -> int: ...
