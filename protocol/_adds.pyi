"""Types of the compiled add work (protocol/_adds.pyx): ``aiobk.protocol.add_codecs`` chooses
it."""

from collections.abc import Sequence

from aiobk.protocol.entry import DigestType

def encode_entry(
    ledger_id: int, entry_id: int, lac: int, length: int, kind: DigestType, payload: bytes
) -> bytes | None: ...
def pack_bodies(bodies: Sequence[bytes]) -> bytes: ...
