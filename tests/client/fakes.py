"""Fake bookies for component tests: the real wire protocol over in-memory transports, with
rules that hold, drop or fail chosen requests so a test can force an exact interleaving.

A fake bookie keeps what a bookie must (entries, master key, fence bit, LAC) and behaves as
spec'd: fenced ledgers refuse normal adds, a fence of an unknown ledger creates it, reads of a
missing entry are explicit negatives. No sockets, no disk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiobk.client.net import P
from aiobk.metadata import BookieServiceInfo, MetadataStore
from aiobk.protocol import (
    LAC_ENTRY_ID,
    AddFlag,
    AddRequest,
    AddResponse,
    ErrorResponse,
    ForceRequest,
    ForceResponse,
    FrameDecoder,
    HandshakeRequest,
    HandshakeResponse,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StatusCode,
    WriteLacRequest,
    WriteLacResponse,
    decode_request,
    encode,
    peek_header,
)
from aiobk.tasks import TaskKeeper

Predicate = Callable[[Request], bool]


@dataclass
class Gate:
    """A held request: ``arrived`` is set when it comes in, ``release()`` lets it through."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    count: int = 0

    def release(self) -> None:
        self._open.set()


@dataclass
class Rule:
    predicate: Predicate
    action: str  # "hold", "drop", "fail", "reject"
    status: StatusCode = StatusCode.EIO
    gate: Gate | None = None
    times: int | None = None  # None: every match


@dataclass
class FakeLedger:
    key: bytes
    fenced: bool = False
    lac: int = -1
    entries: dict[int, bytes] = field(default_factory=dict)


def is_add(entry: int | None = None, recovery: bool | None = None) -> Predicate:
    def match(request: Request) -> bool:
        if not isinstance(request, AddRequest):
            return False
        if entry is not None and request.entry_id != entry:
            return False
        return recovery is None or bool(request.flags & AddFlag.RECOVERY_ADD) == recovery

    return match


def is_fence_lac() -> Predicate:
    return lambda r: (
        isinstance(r, ReadRequest) and bool(r.flags & ReadFlag.FENCE) and r.entry_id == LAC_ENTRY_ID
    )


def is_read(entry: int, fence: bool | None = None) -> Predicate:
    def match(request: Request) -> bool:
        if not isinstance(request, ReadRequest) or request.entry_id != entry:
            return False
        return fence is None or bool(request.flags & ReadFlag.FENCE) == fence

    return match


def any_request() -> Predicate:
    return lambda r: not isinstance(r, HandshakeRequest)


class FakeBookie:
    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.ledgers: dict[int, FakeLedger] = {}
        self.rules: list[Rule] = []
        self.processed: list[Request] = []
        self.down = False  # refuses connections, and drops live ones
        self.connections: list[_ServerSide] = []
        self.lac_moved = asyncio.Event()  # set, and replaced, when a ledger's LAC moves

    def _raise_lac(self, ledger: FakeLedger, lac: int) -> None:
        if lac > ledger.lac:
            ledger.lac = lac
            self.lac_moved.set()
            self.lac_moved = asyncio.Event()

    # ------------------------------------------------------------------ rules

    def hold(self, predicate: Predicate, times: int | None = 1) -> Gate:
        gate = Gate()
        self.rules.append(Rule(predicate, "hold", gate=gate, times=times))
        return gate

    def drop(self, predicate: Predicate, times: int | None = None) -> None:
        self.rules.append(Rule(predicate, "drop", times=times))

    def fail(
        self, predicate: Predicate, status: StatusCode = StatusCode.EIO, times: int | None = None
    ) -> None:
        self.rules.append(Rule(predicate, "fail", status, times=times))

    def reject(self, predicate: Predicate, times: int | None = None) -> None:
        """Answer as a bookie answers a request it cannot take: an ErrorResponse (EBADREQ)."""
        self.rules.append(Rule(predicate, "reject", StatusCode.EBADREQ, times=times))

    def _match(self, request: Request) -> Rule | None:
        for rule in self.rules:
            if rule.times == 0 or not rule.predicate(request):
                continue
            if rule.times is not None:
                rule.times -= 1
            return rule
        return None

    def crash(self) -> None:
        self.down = True
        for conn in list(self.connections):
            conn.disconnect()

    def revive(self) -> None:
        self.down = False

    # ------------------------------------------------------------------ behaviour

    def has(self, ledger_id: int, entry_id: int) -> bool:
        ledger = self.ledgers.get(ledger_id)
        return ledger is not None and entry_id in ledger.entries

    def handle(self, request: Request) -> Response:
        self.processed.append(request)
        if isinstance(request, HandshakeRequest):
            return HandshakeResponse(request.txn_id, StatusCode.EOK, 1, self.bookie_id)
        if isinstance(request, AddRequest):
            return self._add(request)
        if isinstance(request, ReadRequest):
            return self._read(request)
        if isinstance(request, ReadLacRequest):
            ledger = self.ledgers.get(request.ledger_id)
            if ledger is None:
                return ReadLacResponse(request.txn_id, StatusCode.ENOLEDGER, request.ledger_id)
            top = max(ledger.entries, default=-1)
            return ReadLacResponse(
                request.txn_id, StatusCode.EOK, request.ledger_id, ledger.lac, top
            )
        if isinstance(request, WriteLacRequest):
            ledger = self.ledgers.get(request.ledger_id)
            if ledger is None:
                return WriteLacResponse(request.txn_id, StatusCode.ENOLEDGER, request.ledger_id)
            self._raise_lac(ledger, request.lac)
            return WriteLacResponse(request.txn_id, StatusCode.EOK, request.ledger_id, ledger.lac)
        if isinstance(request, ForceRequest):  # everything a fake holds counts as synced
            ledger = self.ledgers.get(request.ledger_id)
            if ledger is None:
                return ForceResponse(request.txn_id, StatusCode.ENOLEDGER, request.ledger_id)
            synced = -1
            while synced + 1 in ledger.entries:
                synced += 1
            return ForceResponse(request.txn_id, StatusCode.EOK, request.ledger_id, synced)
        return ErrorResponse(request.txn_id, StatusCode.EBADREQ, int(request.op))

    def _ledger(self, ledger_id: int, key: bytes) -> FakeLedger | None:
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            ledger = self.ledgers[ledger_id] = FakeLedger(key)
        return ledger if ledger.key == key else None

    def _add(self, request: AddRequest) -> AddResponse:
        def answer(status: StatusCode) -> AddResponse:
            return AddResponse(request.txn_id, status, request.ledger_id, request.entry_id)

        ledger = self._ledger(request.ledger_id, request.master_key)
        if ledger is None:
            return answer(StatusCode.EUA)
        if ledger.fenced and not request.flags & AddFlag.RECOVERY_ADD:
            return answer(StatusCode.EFENCED)
        ledger.entries[request.entry_id] = request.body
        self._raise_lac(ledger, peek_header(request.body)[2])
        return answer(StatusCode.EOK)

    def _read(self, request: ReadRequest) -> ReadResponse:
        def answer(
            status: StatusCode, ledger: FakeLedger | None, body: bytes | None = None
        ) -> ReadResponse:
            lac = ledger.lac if ledger else -1
            top = max(ledger.entries, default=-1) if ledger else -1
            return ReadResponse(
                request.txn_id, status, request.ledger_id, request.entry_id, lac, top, body
            )

        if request.flags & ReadFlag.FENCE:
            ledger = self._ledger(request.ledger_id, request.master_key)
            if ledger is None:
                return answer(StatusCode.EUA, None)
            ledger.fenced = True
        else:
            ledger = self.ledgers.get(request.ledger_id)
            if ledger is None:
                return answer(StatusCode.ENOLEDGER, None)
        if request.entry_id == LAC_ENTRY_ID:
            return answer(StatusCode.EOK, ledger)
        body = ledger.entries.get(request.entry_id)
        if body is None:
            status = StatusCode.EOK if request.flags & ReadFlag.LONG_POLL else StatusCode.ENOENTRY
            return answer(status, ledger)
        return answer(StatusCode.EOK, ledger, body)


class _ServerSide:
    """The fake bookie's end of one connection."""

    def __init__(
        self, bookie: FakeBookie, client: asyncio.Protocol, transport: FakeTransport
    ) -> None:
        self.bookie = bookie
        self.client = client
        self.transport = transport
        self.decoder = FrameDecoder()
        self.closed = False
        self.tasks = TaskKeeper()
        self.loop = asyncio.get_running_loop()

    def receive(self, data: bytes) -> None:
        for frame in self.decoder.feed(data):
            request = decode_request(frame)
            self.tasks.spawn(self._process(request))

    async def _process(self, request: Request) -> None:
        rule = self.bookie._match(request)
        if rule is not None:
            if rule.action == "drop":
                return
            if rule.action == "fail":
                self._reply(_failure(request, rule.status))
                return
            if rule.action == "reject":
                self._reply(ErrorResponse(request.txn_id, rule.status, int(request.op)))
                return
            assert rule.gate is not None
            rule.gate.count += 1
            rule.gate.arrived.set()
            await rule.gate._open.wait()
        if self.closed or self.bookie.down:
            return
        response = self.bookie.handle(request)
        if isinstance(request, ReadRequest) and request.flags & ReadFlag.LONG_POLL:
            await self._long_poll(request)
            response = self.bookie.handle(request)
        self._reply(response)

    async def _long_poll(self, request: ReadRequest) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(request.timeout_ms / 1000):
                while True:
                    ledger = self.bookie.ledgers.get(request.ledger_id)
                    if ledger is not None and ledger.lac > request.previous_lac:
                        return
                    await self.bookie.lac_moved.wait()

    def _reply(self, response: Response) -> None:
        if not self.closed:
            data = encode(response)
            self.loop.call_soon(self._deliver, data)

    def _deliver(self, data: bytes) -> None:
        if not self.closed:
            self.client.data_received(data)

    def disconnect(self) -> None:
        if not self.closed:
            self.closed = True
            self.tasks.cancel()
            if self in self.bookie.connections:
                self.bookie.connections.remove(self)
            self.loop.call_soon(self.client.connection_lost, None)


def _failure(request: Request, status: StatusCode) -> Response:
    if isinstance(request, AddRequest):
        return AddResponse(request.txn_id, status, request.ledger_id, request.entry_id)
    if isinstance(request, ReadRequest):
        return ReadResponse(request.txn_id, status, request.ledger_id, request.entry_id)
    return ErrorResponse(request.txn_id, status, int(request.op))


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.server: _ServerSide | None = None
        self._closing = False

    def write(self, data: Any) -> None:
        server = self.server
        if server is not None and not server.closed:
            asyncio.get_running_loop().call_soon(server.receive, bytes(data))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True
        if self.server is not None:
            self.server.disconnect()

    def abort(self) -> None:
        self.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class FakeNetwork:
    """A ``Connector`` whose addresses lead to fake bookies."""

    def __init__(self) -> None:
        self.bookies: dict[str, FakeBookie] = {}
        self.connect_gates: dict[str, Gate] = {}  # a connection to this bookie waits for it

    def add(self, bookie_id: str) -> FakeBookie:
        bookie = self.bookies[bookie_id] = FakeBookie(bookie_id)
        return bookie

    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]:
        gate = self.connect_gates.get(f"{host}:{port}")
        if gate is not None:
            gate.count += 1
            gate.arrived.set()
            await gate._open.wait()
        bookie = self.bookies.get(f"{host}:{port}")
        if bookie is None or bookie.down:
            raise ConnectionRefusedError(f"no fake bookie at {host}:{port}")
        protocol = factory()
        transport = FakeTransport()
        server = _ServerSide(bookie, protocol, transport)
        transport.server = server
        bookie.connections.append(server)
        protocol.connection_made(transport)
        return transport, protocol

    async def register_all(self, store: MetadataStore) -> None:
        for bookie_id in self.bookies:
            await store.register_bookie(BookieServiceInfo(bookie_id, bookie_id), ttl=3600)
