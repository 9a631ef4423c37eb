"""What a run did and saw: appends (invoke then ok / unknown), reads, LACs observed, and what the
wire tap saw bookies answer. The checker judges it at the end; the tap judges the wire as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiobk.protocol import (
    AddFlag,
    AddRequest,
    AddResponse,
    FrameDecoder,
    ReadFlag,
    ReadRequest,
    ReadResponse,
    StatusCode,
    decode_request,
    decode_response,
)
from tests.sim.network import SimConnection
from tests.sim.world import World


@dataclass
class Append:
    ledger_id: int
    value: bytes
    invoked: float
    # ok | fail (refused before it was sent: must never be read) | unknown (failed after it
    # was sent: may or may not be stored)
    result: str = "pending"
    entry_id: int = -1
    error: str = ""


@dataclass
class LogAppend:
    """One append to a log: invoke, then ok (with its position) or unknown."""

    writer: str
    value: bytes
    result: str = "pending"
    position: tuple[int, int] = (-1, -1)
    error: str = ""


@dataclass
class ProducerAppend:
    """One append of a producer's sequence (a first send or a re-send), as the producer saw
    it: ok (with its position), dup (None: the writer had it already) or unknown (failed, or
    the producer died first)."""

    producer: str
    log: str
    sequence: int
    value: bytes
    client: str  # the node it was sent from
    result: str = "pending"
    position: tuple[int, int] | None = None
    error: str = ""

    @property
    def acknowledged(self) -> bool:
        return self.result in ("ok", "dup")


@dataclass
class Observed:
    """An entry a reader was handed, with the LAC that reader knew then."""

    who: str
    ledger_id: int
    entry_id: int
    value: bytes
    known_lac: int


@dataclass(frozen=True)
class LogRead:
    """One whole read of the log (the offload profile's reader, ``follow=False``): what it
    returned, in order, and how far truncations had cut the log once it ended."""

    who: str
    records: list[tuple[tuple[int, int], bytes]]
    truncated_below: int  # the highest ledger a truncation cut below, once it ended


@dataclass
class History:
    appends: list[Append] = field(default_factory=list)
    reads: list[Observed] = field(default_factory=list)
    lacs: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    ledgers: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # id -> E, WQ, AQ
    volatile: set[int] = field(default_factory=set)  # BP-14 ledgers among them
    # Volatile ledgers their writer closed (close() returned), and whether any fault of the run
    # could lose written-but-unsynced data (a crash, a wipe, a full disk). Without such a
    # fault nothing acknowledged may be missing from those ledgers (BP-14 close-to-open).
    writer_closed: set[int] = field(default_factory=set)
    unsynced_loss: bool = False
    deleted: set[int] = field(default_factory=set)  # closed, then deleted (or tried to be)
    log_appends: list[LogAppend] = field(default_factory=list)
    log_ledgers: set[int] = field(default_factory=set)  # ledgers that belong to the log
    # The ledger of every truncation's ``before`` (truncation and retention passes), recorded
    # before the call: any ledger below one of them may be gone from the log, legitimately.
    log_truncations: list[int] = field(default_factory=list)
    # The producers profile: every append of every producer, in call order, and their logs.
    producer_appends: list[ProducerAppend] = field(default_factory=list)
    producer_logs: set[str] = field(default_factory=set)
    # The offload profile: its whole reads of the log, and what offloading did (for the summary).
    log_reads: list[LogRead] = field(default_factory=list)
    offload: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def max_lac(self, ledger_id: int) -> int:
        """The highest LAC any writer or reader saw for the ledger."""
        seen = [max(v) for (_who, lid), v in self.lacs.items() if lid == ledger_id and v]
        return max(seen, default=-1)

    def lac(self, who: str, ledger_id: int, value: int) -> None:
        seen = self.lacs.setdefault((who, ledger_id), [])
        if seen and value < seen[-1]:
            self.violations.append(
                f"I9 LAC went down for {who} on ledger {ledger_id}: {seen[-1]} -> {value}"
            )
        seen.append(value)


_FENCE_DONE = (StatusCode.EOK, StatusCode.ENOENTRY, StatusCode.EUNKNOWN)


class WireTap:
    """Decodes every frame the simulated network delivers and checks, at the bookie:

    - I5: a normal add that reached a bookie whose copy of the ledger was already fenced is
      never acknowledged;
    - I10: a ledger in limbo never gets NoSuchEntry / NoSuchLedger for an entry read;
    - and records which fences each bookie acknowledged (I11 is checked at every boot).
    """

    def __init__(self, world: World, history: History) -> None:
        self._world = world
        self._history = history
        self._decoders: dict[tuple[int, str], FrameDecoder] = {}
        self._fenced_adds: set[tuple[int, int]] = set()
        self._requests: dict[tuple[int, int], ReadRequest] = {}

    def __call__(self, conn: SimConnection, source: str, target: str, data: bytes) -> None:
        key = (id(conn), source)
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = self._decoders[key] = FrameDecoder()
        requests = source == conn.nodes[0]
        for frame in decoder.feed(data):
            if requests:
                self._request(conn, target, frame)
            else:
                self._response(conn, source, frame)

    def _state(self, node: str, ledger_id: int) -> object | None:
        sim = self._world.bookies.get(node)
        if sim is None or sim.bookie is None:
            return None
        return sim.bookie.storage.ledgers.get(ledger_id)

    def _request(self, conn: SimConnection, bookie: str, frame: bytes) -> None:
        try:
            request = decode_request(frame)
        except Exception:
            return
        if isinstance(request, AddRequest) and not request.flags & AddFlag.RECOVERY_ADD:
            state = self._state(bookie, request.ledger_id)
            if state is not None and getattr(state, "fenced", False):
                self._fenced_adds.add((id(conn), request.txn_id))
        elif isinstance(request, ReadRequest):
            self._requests[(id(conn), request.txn_id)] = request

    def _response(self, conn: SimConnection, bookie: str, frame: bytes) -> None:
        response = decode_response(frame)
        key = (id(conn), response.txn_id)
        if isinstance(response, AddResponse):
            if key in self._fenced_adds:
                self._fenced_adds.discard(key)
                if response.status is StatusCode.EOK:
                    self._history.violations.append(
                        f"I5 bookie {bookie} acknowledged a normal add {response.ledger_id}/"
                        f"{response.entry_id} that arrived after it had fenced the ledger"
                    )
            return
        request = self._requests.pop(key, None)
        if request is None or not isinstance(response, ReadResponse):
            return
        if response.status in (StatusCode.ENOENTRY, StatusCode.ENOLEDGER) and request.entry_id >= 0:
            state = self._state(bookie, request.ledger_id)
            if state is not None and getattr(state, "limbo", False):
                self._history.violations.append(
                    f"I10 bookie {bookie} answered {response.status.name} for "
                    f"{request.ledger_id}/{request.entry_id} while in limbo"
                )
        if request.flags & ReadFlag.FENCE and response.status in _FENCE_DONE:
            sim = self._world.bookies[bookie]
            sim.fenced_acked.add(request.ledger_id)
