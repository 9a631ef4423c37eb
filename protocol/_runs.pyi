"""Types of the compiled run check (protocol/_runs.pyx); ``aiobk.protocol.runs`` chooses it."""

def check_run(
    packed: bytes, ledger_id: int, first: int, last: int, kind: int, check_digest: bool
) -> list[bytes] | None: ...
