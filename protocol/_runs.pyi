"""Types of the compiled copy work (protocol/_runs.pyx): ``aiobk.client.run_check`` and
``aiobk.protocol.offload_object`` choose it."""

from collections.abc import Sequence

def check_run(
    packed: bytes, ledger_id: int, first: int, last: int, kind: int, check_digest: bool
) -> list[bytes] | None: ...
def pack_run(
    block: bytearray,
    block_size: int,
    records: bytearray,
    offset: int,
    bodies: Sequence[bytes],
    first: int,
) -> int: ...
def check_entries(data: bytes, base: int, records: bytes, start: int, stop: int) -> bool: ...
def check_tiling(entries: bytes, blocks: bytes, start: int, end: int) -> bool: ...
