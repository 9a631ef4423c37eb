"""What a request may carry, checked where it enters a bookie (pure: no I/O).

The decoder (``protocol.codec``) accepts any message of the right shape and 64-bit integers;
this module narrows each field to what the bookie can act on and store, so that nothing a peer
sends can be acknowledged and later fail to encode in the journal or the index (a bookie that
acknowledged such a request could never checkpoint or restart again):

- ledger ids are 0..2**63-1; entry ids 0..MAX_ENTRY_ID (-1 only where it means "the LAC");
- a master key is empty or exactly ``MASTER_KEY_SIZE`` bytes (a SHA-256 of the password), and
  required wherever a request writes or fences;
- LACs are -1 or an entry id; a long poll's timeout is not negative;
- a range read names a non-empty range of entry ids and a positive byte bound (the bookie
  narrows both to its own caps);
- flags carry no bits this protocol version does not define.

``check_request`` raises ``MalformedMessageError`` (with the txn id and op, so the bookie
answers EBADREQ and keeps the connection).
"""

from __future__ import annotations

from aiobk.protocol.keys import MASTER_KEY_SIZE
from aiobk.protocol.messages import (
    INT64_MAX,
    LAC_ENTRY_ID,
    AddBatchRequest,
    AddFlag,
    AddRequest,
    ForceRequest,
    MalformedMessageError,
    ReadFlag,
    ReadLacRequest,
    ReadRangeRequest,
    ReadRequest,
    Request,
    WriteLacRequest,
)

MAX_LEDGER_ID = INT64_MAX
# One below the int64 maximum, so that "the next entry" (id + 1) always fits.
MAX_ENTRY_ID = INT64_MAX - 1
# Bits no flag names, as plain ints: tested with int's own ``&`` (an IntFlag's ``&`` goes through
# the enum machinery, 4% of a bookie's CPU per add in a profile).
_ADD_UNKNOWN = ~int(AddFlag.RECOVERY_ADD)
_READ_UNKNOWN = ~int(ReadFlag.FENCE | ReadFlag.LONG_POLL)
_bits = int.__and__


def _refuse(request: Request, why: str) -> MalformedMessageError:
    return MalformedMessageError(f"{type(request).__name__}: {why}", request.txn_id, request.op)


def _ledger(request: Request, ledger_id: int) -> None:
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise _refuse(request, f"ledger id {ledger_id} is out of range")


def _key(request: Request, key: bytes, required: bool) -> None:
    if len(key) == MASTER_KEY_SIZE or (not key and not required):
        return
    want = f"{MASTER_KEY_SIZE} bytes" if required else f"empty or {MASTER_KEY_SIZE} bytes"
    raise _refuse(request, f"master key of {len(key)} bytes (want {want})")


def _lac(request: Request, name: str, lac: int) -> None:
    if not LAC_ENTRY_ID <= lac <= MAX_ENTRY_ID:
        raise _refuse(request, f"{name} {lac} is out of range")


def check_request(request: Request) -> None:
    """Raise ``MalformedMessageError`` unless every field is within the limits above."""
    if isinstance(request, AddRequest):
        _ledger(request, request.ledger_id)
        if not 0 <= request.entry_id <= MAX_ENTRY_ID:
            raise _refuse(request, f"entry id {request.entry_id} is out of range")
        if _bits(request.flags, _ADD_UNKNOWN):
            raise _refuse(request, f"unknown flags {int(request.flags):#x}")
        _key(request, request.master_key, required=True)
    elif isinstance(request, AddBatchRequest):  # its entries: protocol.batch, when handled
        _ledger(request, request.ledger_id)
        if _bits(request.flags, _ADD_UNKNOWN):
            raise _refuse(request, f"unknown flags {int(request.flags):#x}")
        _key(request, request.master_key, required=True)
    elif isinstance(request, ReadRequest):
        _ledger(request, request.ledger_id)
        _lac(request, "entry id", request.entry_id)
        if _bits(request.flags, _READ_UNKNOWN):
            raise _refuse(request, f"unknown flags {int(request.flags):#x}")
        _key(request, request.master_key, required=bool(request.flags & ReadFlag.FENCE))
        if request.flags & ReadFlag.LONG_POLL:
            _lac(request, "previous LAC", request.previous_lac)
            if request.timeout_ms < 0:
                raise _refuse(request, f"negative long-poll timeout {request.timeout_ms}")
    elif isinstance(request, ReadRangeRequest):
        _ledger(request, request.ledger_id)
        first, last = request.first_entry_id, request.last_entry_id
        if not 0 <= first <= last <= MAX_ENTRY_ID:
            raise _refuse(request, f"entries {first}..{last} are not a range of entry ids")
        if request.max_bytes < 1:
            raise _refuse(request, f"max_bytes {request.max_bytes} is not positive")
    elif isinstance(request, WriteLacRequest):
        _ledger(request, request.ledger_id)
        _key(request, request.master_key, required=True)
        _lac(request, "LAC", request.lac)
    elif isinstance(request, ForceRequest):
        _ledger(request, request.ledger_id)
        _key(request, request.master_key, required=False)
    elif isinstance(request, ReadLacRequest):
        _ledger(request, request.ledger_id)
