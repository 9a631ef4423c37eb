"""A simulated network: in-memory TCP connections between named nodes, with seeded latency
and the faults a real network has.

A connection is two ordered byte pipes. Every write is delivered after a seeded delay, never
before an earlier write on the same pipe (TCP's ordering). Faults:

- ``partition(a, b)`` (one-way) holds everything a sends to b until ``heal`` -- TCP retransmits
  what a partition swallowed, so the bytes arrive late, not never; connects across it hang.
- ``pause(node)`` is SIGSTOP seen from outside: nothing in or out of the node until ``resume``.
- ``reset_next(a, b)`` breaks the next connection that carries a write from a to b, at that
  write: the write and everything after it are lost and both ends see the connection drop.
  This is how a request (client to bookie) or a reply (bookie to client) gets lost on TCP.
- ``lag[(a, b)]`` adds latency to everything a sends to b (a slow link, in order).
- ``crash(node)`` resets every connection of the node and stops its listeners.
- a node in ``dead`` (a killed client) connects nowhere again: its connects never return.

``tap`` (if set) sees every delivered write as (source, destination, bytes), for the checker.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

P = TypeVar("P", bound=asyncio.Protocol)
Tap = Callable[["SimConnection", str, str, bytes], None]


@dataclass
class _Pipe:
    source: str
    target: str
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    last: float = 0.0
    timer: asyncio.TimerHandle | None = None
    eof: bool = False  # the sender closed: connection_lost after the queue drains


class SimTransport(asyncio.Transport):
    def __init__(self, conn: SimConnection, side: int) -> None:
        super().__init__()
        self._conn = conn
        self._side = side
        self._closing = False
        self.reading = True
        self.handle_closed = False  # connection_lost delivered, or aborted here

    def write(self, data: Any) -> None:
        if self.handle_closed:
            # uvloop (production) raises on a closed handle rather than ignoring the write.
            raise RuntimeError("unable to perform operation on a closed transport")
        if not self._closing:
            self._conn.send(self._side, bytes(data))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._conn.close_side(self._side)

    def abort(self) -> None:
        self._closing = True
        self.handle_closed = True
        self._conn.reset("aborted by " + self._conn.nodes[self._side])

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self._conn.nodes[1 - self._side], 0)
        return default

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            self._conn.pump_all()

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Nothing is buffered here: writes are delivered as the simulated network goes."""


class SimConnection:
    def __init__(
        self, net: SimNetwork, nodes: tuple[str, str], protocols: tuple[asyncio.Protocol, ...]
    ) -> None:
        self.net = net
        self.nodes = nodes
        self.protocols = protocols
        self.transports = (SimTransport(self, 0), SimTransport(self, 1))
        self.pipes = (_Pipe(nodes[0], nodes[1]), _Pipe(nodes[1], nodes[0]))
        self.dead = False
        self.lost = [False, False]

    def send(self, side: int, data: bytes) -> None:
        if self.dead:
            return
        pipe = self.pipes[side]
        if self.net.take_reset(pipe.source, pipe.target):
            self.net.trace(f"net: reset {pipe.source}->{pipe.target} losing {len(data)} bytes")
            self.reset("injected reset")
            return
        loop = asyncio.get_running_loop()
        at = max(
            pipe.last,
            loop.time() + self.net.latency() + self.net.lag.get((pipe.source, pipe.target), 0.0),
        )
        pipe.last = at
        pipe.queue.append((at, data))
        self._schedule(side)

    def _schedule(self, side: int) -> None:
        pipe = self.pipes[side]
        if pipe.timer is not None or self.dead:
            return
        if pipe.queue:
            when = pipe.queue[0][0]
        elif pipe.eof:
            when = pipe.last
        else:
            return
        pipe.timer = asyncio.get_running_loop().call_at(when, self._pump, side)

    def _pump(self, side: int) -> None:
        pipe = self.pipes[side]
        pipe.timer = None
        if self.dead:
            return
        receiver = self.transports[1 - side]
        if not self.net.can_flow(pipe.source, pipe.target) or not receiver.reading:
            return  # held: pump_all() restarts it
        # A timer within the clock's resolution counts as due (asyncio's rule): so does data.
        now = asyncio.get_running_loop().time() + 1e-5
        protocol = self.protocols[1 - side]
        while pipe.queue and pipe.queue[0][0] <= now and not self.dead:
            _at, data = pipe.queue.popleft()
            self.net.observe(self, pipe.source, pipe.target, data)
            protocol.data_received(data)
            if not receiver.reading or not self.net.can_flow(pipe.source, pipe.target):
                return
        if not pipe.queue and pipe.eof and not self.dead:
            self._finish()
            return
        self._schedule(side)

    def pump_all(self) -> None:
        for side in (0, 1):
            if self.pipes[side].timer is None:
                self._schedule(side)

    def close_side(self, side: int) -> None:
        """An orderly close: the peer gets what was sent, then connection_lost."""
        if self.dead:
            return
        pipe = self.pipes[side]
        pipe.eof = True
        pipe.last = max(pipe.last, asyncio.get_running_loop().time() + self.net.latency())
        self._schedule(side)

    def _finish(self) -> None:
        self.dead = True
        self._lose_both(None)

    def _deliver_loss(self, side: int, exc: Exception | None) -> None:
        self.transports[side].handle_closed = True
        self.protocols[side].connection_lost(exc)

    def reset(self, why: str) -> None:
        """Both ends see the connection drop; whatever was in flight is gone."""
        if self.dead:
            return
        self.dead = True
        for pipe in self.pipes:
            if pipe.timer is not None:
                pipe.timer.cancel()
                pipe.timer = None
            pipe.queue.clear()
        self._lose_both(ConnectionResetError(why))

    def _lose_both(self, exc: Exception | None) -> None:
        loop = asyncio.get_running_loop()
        for side in (0, 1):
            if not self.lost[side]:
                self.lost[side] = True
                self.transports[side]._closing = True
                loop.call_later(self.net.latency(), self._deliver_loss, side, exc)
        self.net.connections.pop(self, None)


class _Listener:
    def __init__(self, net: SimNetwork, node: str, port: int, factory: Any) -> None:
        self.net = net
        self.node = node
        self.port = port
        self.factory = factory
        self.serving = False
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.net.listeners.pop((self.node, self.port), None)

    async def start_serving(self) -> None:
        self.serving = True

    async def wait_closed(self) -> None:
        return None


class _ServerSide:
    def __init__(self, net: SimNetwork, node: str) -> None:
        self._net = net
        self._node = node

    async def start_server(self, factory: Any, host: str, port: int) -> _Listener:
        if host != self._node:
            raise OSError(99, f"cannot assign requested address {host}")
        key = (host, port)
        if key in self._net.listeners:
            raise OSError(98, f"address already in use: {host}:{port}")
        listener = self._net.listeners[key] = _Listener(self._net, host, port, factory)
        return listener


class _ClientSide:
    def __init__(self, net: SimNetwork, node: str) -> None:
        self._net = net
        self._node = node

    async def connect(
        self, factory: Callable[[], P], host: str, port: int
    ) -> tuple[asyncio.Transport, P]:
        net = self._net
        if self._node in net.dead:
            await net.hang()  # a dead process sends nothing
        await asyncio.sleep(net.latency())
        # SYN retries while the path is cut or the peer is stopped; the caller's timeout ends it.
        while True:
            listener = net.listeners.get((host, port))
            if listener is None or listener.closed:
                raise ConnectionRefusedError(111, f"connection refused by {host}:{port}")
            if (
                listener.serving
                and net.can_flow(self._node, host)
                and net.can_flow(host, self._node)
            ):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(net.latency())
        client = factory()
        server = listener.factory()
        conn = SimConnection(net, (self._node, host), (client, server))
        net.connections[conn] = None
        server.connection_made(conn.transports[1])
        client.connection_made(conn.transports[0])
        return conn.transports[0], client


class SimNetwork:
    def __init__(self, rng: random.Random, trace: Callable[[str], None]) -> None:
        self._rng = rng
        self.trace = trace
        self.listeners: dict[tuple[str, int], _Listener] = {}
        # In the order made (a dict): a crash resets them in that order, each drawing its loss's
        # latency from the seeded generator -- a set would order them by address, which
        # differs between two runs of one seed.
        self.connections: dict[SimConnection, None] = {}
        self.cut: set[tuple[str, str]] = set()
        self.paused: set[str] = set()
        self.resets: dict[tuple[str, str], int] = {}
        self.tap: Tap | None = None
        self.slow = 0.0  # probability that one delivery takes 1-20 ms instead of microseconds
        self.lag: dict[tuple[str, str], float] = {}  # extra one-way latency of a link
        self.dead: set[str] = set()  # killed client nodes: never heal
        self._hung: list[asyncio.Future[None]] = []  # what their calls wait for: forever

    def latency(self) -> float:
        if self.slow and self._rng.random() < self.slow:
            return self._rng.uniform(1e-3, 2e-2)
        return self._rng.uniform(2e-5, 4e-4)

    def server_network(self, node: str) -> _ServerSide:
        return _ServerSide(self, node)

    def connector(self, node: str) -> _ClientSide:
        return _ClientSide(self, node)

    def observe(self, conn: SimConnection, source: str, target: str, data: bytes) -> None:
        if self.tap is not None:
            self.tap(conn, source, target, data)

    # ------------------------------------------------------------------ faults

    def can_flow(self, source: str, target: str) -> bool:
        return (
            (source, target) not in self.cut
            and source not in self.paused
            and target not in self.paused
        )

    def partition(self, source: str, target: str) -> None:
        self.cut.add((source, target))

    def pause(self, node: str) -> None:
        self.paused.add(node)

    def resume(self, node: str) -> None:
        self.paused.discard(node)
        self._kick()

    def heal(self) -> None:
        self.lag.clear()
        self.cut.clear()
        self.paused.clear()
        self.resets.clear()
        self._kick()

    def heal_link(self, source: str, target: str) -> None:
        self.cut.discard((source, target))
        self._kick()

    def reset_next(self, source: str, target: str) -> None:
        self.resets[(source, target)] = self.resets.get((source, target), 0) + 1

    def take_reset(self, source: str, target: str) -> bool:
        left = self.resets.get((source, target), 0)
        if not left:
            return False
        if left == 1:
            del self.resets[(source, target)]
        else:
            self.resets[(source, target)] = left - 1
        return True

    def crash(self, node: str) -> None:
        for conn in list(self.connections):
            if node in conn.nodes:
                conn.reset(f"{node} crashed")
        for key, listener in list(self.listeners.items()):
            if key[0] == node:
                listener.close()

    def hang(self) -> asyncio.Future[None]:
        """A future never set, for a dead node's call to wait on; kept, so that the task
        waiting is never collected as abandoned."""
        future = asyncio.get_running_loop().create_future()
        self._hung.append(future)
        return future

    def _kick(self) -> None:
        for conn in list(self.connections):
            conn.pump_all()
