"""Flow control: what peers can make a bookie hold, and the bound on each (invariant I16,
docs/design/invariants.md).

Per connection (``bookie.connection``):

- Responses not yet sent. Above ``server_write_buffer_high_water_mark`` bytes the connection
  stops reading requests and its entry reads wait before fetching anything; both resume below
  the low mark. At most ``READS_PER_CONNECTION`` of its entry reads fetch at once. So a peer
  that pipelines reads of large entries and never reads the answers holds about one high-water
  mark, not one entry per request (BookKeeper turns ``autoRead`` off on an unwritable channel).
- At most ``FRAMES_PER_TURN`` of its requests are handled per event-loop turn; the rest wait
  for the next turn with reading paused, so a burst from one peer (or twenty) cannot hold the
  loop while every other peer waits.
- A frame must be complete within ``frame_timeout`` of its first byte; responses that could
  not be sent for ``write_timeout`` (the peer reads nothing) close the connection, as does
  ``connection_idle_timeout`` of silence with nothing in flight.

Bookie-wide (``FlowControl``, one per bookie):

- ``max_connections``. At the cap a new connection takes the place of the one idle longest (an
  idle client just reconnects when it next needs the bookie), or is refused if none is idle, so
  a crowd of idle sockets cannot lock clients out.
- ``max_connection_memory``: partial frames plus queued responses, over all connections. Above
  it the connection holding the most is closed -- a peer that neither reads its answers nor
  finishes its frames; a peer keeping up holds little and is never the biggest for long.
- ``max_reads_in_progress``: entry reads fetching at once (BookKeeper's
  maxReadsInProgressLimit), so their transient buffers are bounded too.
- ``max_add_bytes_in_progress``: bytes of adds received and not yet answered, each counted as
  its body plus ``ADD_HELD_BYTES`` for the objects an add holds meanwhile (its request, its
  answer's closure, its journal record and callbacks: about 1,240 bytes measured, whatever the
  body). Above it every connection stops reading requests until the journal has caught up to
  half of it: clients see the disk's pace as latency instead of the bookie queueing without
  end. Bodies alone were counted before: a flood of 46-byte adds made a bookie capped at 4 MiB
  hold 127 MB (tests/hostile/test_tiny_adds.py).
- Long polls: at most ``max_long_polls_per_connection`` and ``max_long_polls`` wait at once;
  one more is answered ETOOMANYREQUESTS at once.

Every bound is in ``BookieConfig``. ``FifoGate`` is the small admission queue used for reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.stats import BookieStats
from aiobk.tasks import TaskKeeper

log = logging.getLogger(__name__)

READS_PER_CONNECTION = 8  # entry reads of one connection fetching at once
# What an add in progress holds besides its body, charged to ``max_add_bytes_in_progress``:
# 1,224-1,238 bytes an add measured with tracemalloc (tests/hostile/test_tiny_adds.py), rounded up.
ADD_HELD_BYTES = 1280
FRAMES_PER_TURN = 256  # requests of one connection handled per loop turn (a batch: its entries)
SWEEP_INTERVAL = 1.0  # seconds between checks of frame and idle deadlines


class FifoGate:
    """Admission in arrival order: at most ``capacity`` holders, none while closed.

    ``acquire`` is O(1); a release or ``open`` admits exactly as many waiters as there is room
    for. A waiter cancelled after it was admitted hands its place on."""

    __slots__ = ("_active", "_capacity", "_open", "_waiters")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._active = 0
        self._open = True
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _room(self) -> bool:
        return self._open and self._active < self._capacity

    async def acquire(self) -> None:
        if self._room() and not self._waiters:
            self._active += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # admitted: _admit counted it as active already
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # admitted and cancelled in the same turn: pass it on
            raise

    def release(self) -> None:
        self._active -= 1
        self._admit()

    def set_open(self, is_open: bool) -> None:
        self._open = is_open
        if is_open:
            self._admit()

    def _admit(self) -> None:
        waiters = self._waiters
        while waiters and self._room():
            waiter = waiters.popleft()
            if not waiter.done():  # a cancelled waiter stays in the deque until reached
                self._active += 1
                waiter.set_result(None)


class Peer(Protocol):
    """What flow control sees of a connection (``bookie.connection.ServerConnection``)."""

    held: int  # bytes held, as last reported
    last_active: float
    frame_started: float | None
    write_paused_since: float | None
    tasks: TaskKeeper

    @property
    def idle(self) -> bool: ...

    def held_now(self) -> int: ...

    def update_reading(self) -> None: ...

    def drop(self, why: str, quiet: bool = False) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class FlowControl:
    """The bookie-wide bounds of the module docstring; connections report to it."""

    def __init__(self, config: BookieConfig, stats: BookieStats) -> None:
        self.config = config
        self.stats = stats
        self.connections: dict[Peer, None] = {}  # in order of arrival
        self.held = 0  # bytes of partial frames and queued responses, as last reported
        self.reads = asyncio.Semaphore(config.max_reads_in_progress)
        self.add_bytes = 0  # bytes of adds received and not yet answered
        self.adds_paused = False
        self.long_polls = 0
        self._timer: asyncio.TimerHandle | None = None
        self._clock: Callable[[], float] | None = None
        # Set once the bookie stops: a connection accepted just before its listener closed
        # reaches ``connection_made`` after the stop has closed the others, and is refused.
        self.stopped = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.stopped = False
        loop = asyncio.get_running_loop()
        self._clock = loop.time
        self._timer = loop.call_later(SWEEP_INTERVAL, self._sweep)

    def stop(self) -> None:
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------------ connections

    def admit(self, conn: Peer) -> bool:
        """Register a new connection; False if it must be refused (the cap, nothing idle)."""
        if len(self.connections) >= self.config.max_connections:
            idle = [c for c in self.connections if c.idle]
            if not idle:
                self.stats.connections_refused += 1
                return False
            oldest = min(idle, key=lambda c: c.last_active)
            self.stats.connections_evicted += 1
            oldest.drop("the bookie is at max_connections and this connection was idle longest")
        self.connections[conn] = None
        return True

    def forget(self, conn: Peer) -> None:
        if conn in self.connections:
            del self.connections[conn]
            self.held -= conn.held
            conn.held = 0

    def note_held(self, conn: Peer, held: int) -> None:
        """``conn`` now holds ``held`` bytes; over the bookie-wide bound the biggest goes."""
        if conn not in self.connections:
            return
        self.held += held - conn.held
        conn.held = held
        if self.held > self.config.max_connection_memory:
            self._shed()

    def _recount(self) -> None:
        """Buffers drain between reports: count what every connection holds now."""
        total = 0
        for conn in self.connections:
            conn.held = conn.held_now()
            total += conn.held
        self.held = total

    def _shed(self) -> None:
        limit = self.config.max_connection_memory
        self._recount()
        while self.held > limit and self.connections:
            biggest = max(self.connections, key=lambda c: c.held)
            if biggest.held == 0:
                break
            self.stats.connections_shed += 1
            biggest.drop(
                f"holds {biggest.held} bytes of unfinished frames and unread responses, and "
                f"all connections together are over max_connection_memory ({limit})"
            )

    def _sweep(self) -> None:
        """Frame and idle deadlines, and a fresh count of what connections hold."""
        assert self._clock is not None
        now = self._clock()
        self._timer = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._sweep)
        config = self.config
        self._recount()
        for conn in list(self.connections):
            why = None
            if conn.frame_started is not None and now - conn.frame_started > config.frame_timeout:
                why = f"a frame was not completed within {config.frame_timeout:g}s"
            elif (
                conn.write_paused_since is not None
                and now - conn.write_paused_since > config.write_timeout
            ):
                why = f"it has not read its responses for {config.write_timeout:g}s"
            elif conn.idle and now - conn.last_active > config.connection_idle_timeout:
                self.stats.connections_timed_out += 1
                conn.drop(f"idle for {config.connection_idle_timeout:g}s", quiet=True)
                continue
            if why is not None:
                self.stats.connections_timed_out += 1
                conn.drop(why)
        if self.held > config.max_connection_memory:
            self._shed()

    # ------------------------------------------------------------------ adds

    def add_started(self, size: int) -> None:
        self.add_bytes += size
        if self.add_bytes > self.config.max_add_bytes_in_progress and not self.adds_paused:
            self.adds_paused = True
            self.stats.add_pauses += 1
            for conn in self.connections:
                conn.update_reading()

    def add_done(self, size: int) -> None:
        self.add_bytes -= size
        if self.adds_paused and self.add_bytes <= self.config.max_add_bytes_in_progress // 2:
            self.adds_paused = False
            for conn in self.connections:
                conn.update_reading()

    # ------------------------------------------------------------------ long polls

    def long_poll_room(self, waiting_here: int) -> bool:
        """Room for one more long poll on a connection with ``waiting_here`` waiting."""
        return (
            self.long_polls < self.config.max_long_polls
            and waiting_here < self.config.max_long_polls_per_connection
        )
