"""Request and response messages.

Every message is a frozen value. On the wire it is one msgpack array:
``[tag, txn_id, field, ...]`` where the tag of a request is its ``OpCode`` and the tag of a
response is ``OpCode | RESPONSE_BIT``. A response answers the request with the same ``txn_id``
on the same connection; responses may come back in any order. ``ErrorResponse`` answers any
request the bookie could not parse far enough to answer in kind.

Field order in each class is the wire order; the ``_wire`` tuple names the exact Python types a
decoder accepts for each field after ``txn_id`` (msgpack gives int, bytes, str, float, None,
list and dict; anything else is malformed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum, IntFlag
from typing import Any, ClassVar, Self

from aiobk.protocol.compiled import compile_message, enum_lookup
from aiobk.protocol.status import StatusCode

# 2 adds ADD_BATCH, 3 READ_RANGE. A bookie speaks every version from MIN_PROTOCOL_VERSION up and
# answers a handshake with the version asked; a client asks for its newest and, refused with
# EBADVERSION by an older bookie, asks again for the version that bookie names
# (client.connection). A connection uses only the operations of the version it agreed.
PROTOCOL_VERSION = 3
MIN_PROTOCOL_VERSION = 1
RESPONSE_BIT = 0x80
ERROR_TAG = 0xFF

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Entry id used for "the LAC, not an entry" reads (BookKeeper's LAST_ADD_CONFIRMED = -1).
LAC_ENTRY_ID = -1


class OpCode(IntEnum):
    HANDSHAKE = 1
    ADD = 2
    READ = 3
    READ_LAC = 4
    WRITE_LAC = 5
    FORCE = 6
    GET_BOOKIE_INFO = 7
    GC = 8  # operators: run a garbage collection pass now
    BOOKIE_STATE = 9  # operators: read, or force, writable / read-only
    LEDGER_KEY = 10  # replication workers: a ledger's master key, for the cluster's secret
    START_TLS = 11  # upgrade this connection to TLS (BookKeeper's START_TLS), then handshake
    ADD_BATCH = 12  # protocol 2: consecutive adds of one ledger in one frame, one answer
    GC_REPORT = 13  # operators: each entry log's live bytes and why it is kept (no pass run)
    READ_RANGE = 14  # protocol 3: consecutive entries of one ledger in one answer, bytes bounded


class AddFlag(IntFlag):
    NONE = 0
    RECOVERY_ADD = 1  # written back by recovery: accepted even when the ledger is fenced


class ReadFlag(IntFlag):
    NONE = 0
    FENCE = 1  # fence the ledger (durably) before answering; carries the master key
    LONG_POLL = 2  # wait until the bookie's LAC passes previous_lac or timeout_ms ends


class StateChange(IntEnum):
    """What a BOOKIE_STATE request asks."""

    QUERY = 0
    READ_ONLY = 1  # force read-only (as BookKeeper's ``bookie readonly``)
    WRITABLE = 2  # lift the operator's read-only; other reasons (a full disk) still hold


class Durability(IntEnum):
    """What an append's acknowledgement means for a ledger, fixed when it is created.

    ``PERSISTENT``: an ack quorum of bookies fsynced the entry. ``VOLATILE`` (BP-14): an ack
    quorum wrote it (page cache); the LAC advances only as bookies report entries synced, or
    by ``LedgerHandle.force()``.
    """

    PERSISTENT = 0  # acknowledged after fdatasync
    VOLATILE = 1  # BP-14 ("Relax durability"): acknowledged once written


_durability = enum_lookup(Durability)
_add_flag = enum_lookup(AddFlag)
_read_flag = enum_lookup(ReadFlag)
_status = enum_lookup(StatusCode)


class MalformedMessageError(ValueError):
    """A frame that is not a valid message. ``txn_id`` is set when it could be read."""

    def __init__(self, reason: str, txn_id: int | None = None, op: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.txn_id = txn_id
        self.op = op


@dataclass(frozen=True, slots=True)
class Message:
    tag: ClassVar[int]
    _wire: ClassVar[tuple[tuple[type, ...], ...]]
    _names: ClassVar[tuple[str, ...]] = ()
    # Generated per class at import (protocol.compiled): ``from_fields`` builds a message from
    # every field in order, unchecked (no defaults, no conversions: values already right) at a
    # third of ``__init__``'s cost, for hot paths; ``_decode`` checks and builds from a wire
    # array.
    from_fields: ClassVar[Callable[..., Any]]
    _decode: ClassVar[Callable[[list[Any], int, int], Any]]
    txn_id: int

    def to_wire(self) -> list[Any]:  # pragma: no cover - each class gets its own at import
        """The msgpack array for this message (IntEnum values pack as plain ints)."""
        return [self.tag, *[getattr(self, name) for name in self._names]]

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> Self:
        """Build from already type-checked wire values (txn_id first, every field)."""
        message: Self = cls.from_fields(*values)
        return message


_INT = (int,)
_BYTES = (bytes,)
_OPT_BYTES = (bytes, type(None))
_STR = (str,)
_DICT = (dict,)


# ---------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Request(Message):
    op: ClassVar[OpCode]


@dataclass(frozen=True, slots=True)
class HandshakeRequest(Request):
    op = OpCode.HANDSHAKE
    tag = OpCode.HANDSHAKE
    _wire = (_INT, _STR)
    protocol_version: int = PROTOCOL_VERSION
    client_name: str = ""


@dataclass(frozen=True, slots=True)
class AddRequest(Request):
    op = OpCode.ADD
    tag = OpCode.ADD
    _wire = (_INT, _INT, _INT, _INT, _BYTES, _BYTES)
    ledger_id: int
    entry_id: int
    flags: AddFlag = AddFlag.NONE
    durability: Durability = Durability.PERSISTENT
    master_key: bytes = b""
    body: bytes = b""  # an encoded entry (protocol.entry), opaque to the bookie but its header

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> Self:
        txn_id, ledger_id, entry_id, flags, durability, key, body = values
        try:
            level = _durability(durability)
        except ValueError:
            raise MalformedMessageError(f"unknown durability {durability}", txn_id) from None
        flag = _add_flag(flags)
        message: Self = cls.from_fields(txn_id, ledger_id, entry_id, flag, level, key, body)
        return message


@dataclass(frozen=True, slots=True)
class AddBatchRequest(Request):
    """Adds of one ledger in one frame: each entry is handled as the ADD of that entry would be
    (its id is the one in its body's header), and one ``AddBatchResponse`` answers them all once
    every one is answered. ``bodies`` is ``protocol.batch.pack_bodies``'s packing."""

    op = OpCode.ADD_BATCH
    tag = OpCode.ADD_BATCH
    _wire = (_INT, _INT, _INT, _BYTES, _BYTES)
    ledger_id: int
    flags: AddFlag = AddFlag.NONE
    durability: Durability = Durability.PERSISTENT
    master_key: bytes = b""
    bodies: bytes = b""

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> Self:
        txn_id, ledger_id, flags, durability, key, bodies = values
        try:
            level = _durability(durability)
        except ValueError:
            raise MalformedMessageError(f"unknown durability {durability}", txn_id) from None
        message: Self = cls.from_fields(txn_id, ledger_id, _add_flag(flags), level, key, bodies)
        return message


@dataclass(frozen=True, slots=True)
class ReadRequest(Request):
    op = OpCode.READ
    tag = OpCode.READ
    _wire = (_INT, _INT, _INT, _BYTES, _INT, _INT)
    ledger_id: int
    entry_id: int  # LAC_ENTRY_ID reads only the LAC (the fencing read of recovery)
    flags: ReadFlag = ReadFlag.NONE
    master_key: bytes = b""  # required with FENCE
    previous_lac: int = -1  # LONG_POLL: answer once the bookie's LAC is above this
    timeout_ms: int = 0  # LONG_POLL: answer with the current LAC after this long

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> Self:
        txn_id, ledger_id, entry_id, flags, *rest = values
        message: Self = cls.from_fields(txn_id, ledger_id, entry_id, _read_flag(flags), *rest)
        return message


@dataclass(frozen=True, slots=True)
class ReadRangeRequest(Request):
    """Entries ``first_entry_id`` to ``last_entry_id`` of one ledger in one answer: a bulk copy's
    read (an offload), after BookKeeper's batch read. The bookie answers the longest run of
    consecutive stored entries from ``first_entry_id`` that fits in ``max_bytes`` of bodies (at
    least the first entry, whatever its size) and in its own caps; the reader asks again from
    where the answer ends."""

    op = OpCode.READ_RANGE
    tag = OpCode.READ_RANGE
    _wire = (_INT, _INT, _INT, _INT)
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class ReadLacRequest(Request):
    op = OpCode.READ_LAC
    tag = OpCode.READ_LAC
    _wire = (_INT,)
    ledger_id: int


@dataclass(frozen=True, slots=True)
class WriteLacRequest(Request):
    op = OpCode.WRITE_LAC
    tag = OpCode.WRITE_LAC
    _wire = (_INT, _BYTES, _INT)
    ledger_id: int
    master_key: bytes
    lac: int


@dataclass(frozen=True, slots=True)
class ForceRequest(Request):
    op = OpCode.FORCE
    tag = OpCode.FORCE
    _wire = (_INT, _BYTES)
    ledger_id: int
    master_key: bytes = b""


@dataclass(frozen=True, slots=True)
class GetBookieInfoRequest(Request):
    op = OpCode.GET_BOOKIE_INFO
    tag = OpCode.GET_BOOKIE_INFO
    _wire = ()


@dataclass(frozen=True, slots=True)
class GcRequest(Request):
    op = OpCode.GC
    tag = OpCode.GC
    _wire = ()


@dataclass(frozen=True, slots=True)
class GcReportRequest(Request):
    op = OpCode.GC_REPORT
    tag = OpCode.GC_REPORT
    _wire = ()


@dataclass(frozen=True, slots=True)
class BookieStateRequest(Request):
    op = OpCode.BOOKIE_STATE
    tag = OpCode.BOOKIE_STATE
    _wire = (_INT,)
    change: StateChange = StateChange.QUERY

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> Self:
        txn_id, change = values
        try:
            return cls(txn_id, StateChange(change))
        except ValueError:
            raise MalformedMessageError(f"unknown state change {change}", txn_id) from None


@dataclass(frozen=True, slots=True)
class LedgerKeyRequest(Request):
    """A replication worker asks for a ledger's master key, to copy its entries to a new
    bookie and to fence it (autorecovery); ``proof`` is ``key_request_proof`` of the
    cluster's secret (protocol.keys)."""

    op = OpCode.LEDGER_KEY
    tag = OpCode.LEDGER_KEY
    _wire = (_INT, _BYTES)
    ledger_id: int
    proof: bytes = b""


@dataclass(frozen=True, slots=True)
class StartTlsRequest(Request):
    """Upgrade the connection to TLS. After the EOK answer both sides speak TLS on the same
    socket, the client first (its ClientHello); the client sends nothing after this request
    until then, and a bookie that reads more frames behind it closes the connection."""

    op = OpCode.START_TLS
    tag = OpCode.START_TLS
    _wire = ()


# ---------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class Response(Message):
    op: ClassVar[OpCode]
    status: StatusCode

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> Self:
        txn_id, status, *rest = values
        try:
            code = _status(status)
        except ValueError:
            raise MalformedMessageError(f"unknown status {status}", txn_id) from None
        message: Self = cls.from_fields(txn_id, code, *rest)
        return message


@dataclass(frozen=True, slots=True)
class HandshakeResponse(Response):
    op = OpCode.HANDSHAKE
    tag = OpCode.HANDSHAKE | RESPONSE_BIT
    _wire = (_INT, _INT, _STR)
    protocol_version: int = PROTOCOL_VERSION
    bookie_id: str = ""


@dataclass(frozen=True, slots=True)
class AddResponse(Response):
    op = OpCode.ADD
    tag = OpCode.ADD | RESPONSE_BIT
    _wire = (_INT, _INT, _INT, _INT)
    ledger_id: int
    entry_id: int
    last_add_synced: int = -1  # BP-14 sync cursor of a volatile ledger (else the entry's id)


@dataclass(frozen=True, slots=True)
class AddBatchResponse(Response):
    """``status`` EOK: ``statuses`` holds each entry's status, one byte per entry in the
    request's order, or is empty when every entry is EOK (the common case, kept small).
    Another status is every entry's (the batch was not handled)."""

    op = OpCode.ADD_BATCH
    tag = OpCode.ADD_BATCH | RESPONSE_BIT
    _wire = (_INT, _INT, _INT, _BYTES)
    ledger_id: int
    last_add_synced: int = -1  # as AddResponse's, when the last entry was answered
    statuses: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadResponse(Response):
    op = OpCode.READ
    tag = OpCode.READ | RESPONSE_BIT
    _wire = (_INT, _INT, _INT, _INT, _INT, _OPT_BYTES)
    ledger_id: int
    entry_id: int
    lac: int = -1  # the bookie's LAC for the ledger when it answered
    last_entry_id: int = -1  # highest entry id the bookie holds (LAC reads during recovery)
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class ReadRangeResponse(Response):
    """``status`` EOK: ``bodies`` holds entries ``first_entry_id`` on, consecutive, packed as
    an ADD_BATCH's (``protocol.batch.unpack_range`` checks them). Another status is the first
    entry's, as a READ of it would answer, and ``bodies`` is empty."""

    op = OpCode.READ_RANGE
    tag = OpCode.READ_RANGE | RESPONSE_BIT
    _wire = (_INT, _INT, _INT, _INT, _BYTES)
    ledger_id: int
    first_entry_id: int
    lac: int = -1  # the bookie's LAC for the ledger when it answered
    bodies: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadLacResponse(Response):
    op = OpCode.READ_LAC
    tag = OpCode.READ_LAC | RESPONSE_BIT
    _wire = (_INT, _INT, _INT, _INT)
    ledger_id: int
    lac: int = -1
    last_entry_id: int = -1


@dataclass(frozen=True, slots=True)
class WriteLacResponse(Response):
    op = OpCode.WRITE_LAC
    tag = OpCode.WRITE_LAC | RESPONSE_BIT
    _wire = (_INT, _INT, _INT)
    ledger_id: int
    lac: int = -1


@dataclass(frozen=True, slots=True)
class ForceResponse(Response):
    op = OpCode.FORCE
    tag = OpCode.FORCE | RESPONSE_BIT
    _wire = (_INT, _INT, _INT)
    ledger_id: int
    last_add_synced: int = -1


@dataclass(frozen=True, slots=True)
class GetBookieInfoResponse(Response):
    op = OpCode.GET_BOOKIE_INFO
    tag = OpCode.GET_BOOKIE_INFO | RESPONSE_BIT
    _wire = (_INT, _INT, _INT, _DICT)
    free_bytes: int = 0
    total_bytes: int = 0
    stats: dict[str, int] = field(default_factory=dict)  # counters for operators and bench


@dataclass(frozen=True, slots=True)
class GcResponse(Response):
    """What the pass did; ``detail`` says why it stopped early or could not run."""

    op = OpCode.GC
    tag = OpCode.GC | RESPONSE_BIT
    _wire = (_INT, _INT, _INT, _INT, _INT, _STR)
    ledgers_deleted: int = 0
    logs_removed: int = 0
    entries_moved: int = 0
    bytes_freed: int = 0
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GcReportResponse(Response):
    """The bookie's garbage collection report, as JSON (``bookie.gc_report``'s document: its
    shape is the report's, not the codec's), or EIO with a message."""

    op = OpCode.GC_REPORT
    tag = OpCode.GC_REPORT | RESPONSE_BIT
    _wire = (_INT, _STR)
    report: str = ""


@dataclass(frozen=True, slots=True)
class BookieStateResponse(Response):
    """The state after the request: writable or not, every reason it is not, whether recovery
    adds are still taken, and a checkpoint failure if checkpoints are failing."""

    op = OpCode.BOOKIE_STATE
    tag = OpCode.BOOKIE_STATE | RESPONSE_BIT
    _wire = (_INT, _INT, _STR, _INT, _STR)
    writable: int = 1
    reasons: str = ""  # "; "-separated, "source: why"
    high_priority: int = 1
    checkpoint_error: str = ""  # why checkpoints fail, while they do (the journal is kept)


@dataclass(frozen=True, slots=True)
class LedgerKeyResponse(Response):
    """EOK with the key (empty: the bookie has not learned it yet, BP-46), ENOLEDGER, or EUA
    for a wrong proof."""

    op = OpCode.LEDGER_KEY
    tag = OpCode.LEDGER_KEY | RESPONSE_BIT
    _wire = (_INT, _INT, _BYTES)
    ledger_id: int
    master_key: bytes = b""


@dataclass(frozen=True, slots=True)
class StartTlsResponse(Response):
    """EOK: begin the TLS handshake now. EBADREQ: this bookie has no certificate (or the
    connection is TLS already)."""

    op = OpCode.START_TLS
    tag = OpCode.START_TLS | RESPONSE_BIT
    _wire = (_INT,)


@dataclass(frozen=True, slots=True)
class ErrorResponse(Response):
    """Answer to a request the bookie could not decode (always EBADREQ) or an unknown op."""

    tag = ERROR_TAG
    _wire = (_INT, _INT)
    request_op: int = 0


REQUEST_TYPES: dict[int, type[Request]] = {
    cls.tag: cls
    for cls in (
        HandshakeRequest,
        AddRequest,
        AddBatchRequest,
        ReadRequest,
        ReadRangeRequest,
        ReadLacRequest,
        WriteLacRequest,
        ForceRequest,
        GetBookieInfoRequest,
        GcRequest,
        GcReportRequest,
        BookieStateRequest,
        LedgerKeyRequest,
        StartTlsRequest,
    )
}
RESPONSE_TYPES: dict[int, type[Response]] = {
    cls.tag: cls
    for cls in (
        HandshakeResponse,
        AddResponse,
        AddBatchResponse,
        ReadResponse,
        ReadRangeResponse,
        ReadLacResponse,
        WriteLacResponse,
        ForceResponse,
        GetBookieInfoResponse,
        GcResponse,
        GcReportResponse,
        BookieStateResponse,
        LedgerKeyResponse,
        StartTlsResponse,
        ErrorResponse,
    )
}


def _init_names() -> None:
    for cls in (*REQUEST_TYPES.values(), *RESPONSE_TYPES.values()):
        cls._names = tuple(f.name for f in fields(cls))
        if len(cls._names) != len(cls._wire) + 1:  # pragma: no cover - a definition bug
            raise AssertionError(f"{cls.__name__}: _wire does not match its fields")
        own = getattr(cls.from_values, "__func__", None)
        converts = own is not getattr(Message.from_values, "__func__", None)
        compile_message(cls, cls._names, MalformedMessageError, converts=converts)


_init_names()
