"""The producers profile's clients: producers appending to logs through writers opened with a
producer id (``BookKeeper.open_log_writer(name, producer_id=...)``), several to a log taking it
in turn, or each to its own.

A producer numbers its records densely (0, 1, 2, ...) and keeps its own record of what it sent
and what it saw acknowledged. It dies with appends in flight -- its client node killed, as by
SIGKILL (``World.kill``) -- or loses its writer to another producer taking the log, or hands
the log on after a turn. Then it opens a writer with the same producer id again, on a new
client after a death, and re-sends from its own record: every sequence it sent and did not see
acknowledged, or its last N (widened down to the lowest of those); then it goes on with new
sequences. Whatever the failures, each log must then hold every sequence of each producer
once, none missing below one present, in order, and every acknowledged one (I17, checked by
tests.sim.checker); with ``deduplicate_producers`` off, the re-sends land twice.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiobk.client import LogWriter
from aiobk.protocol.errors import BKError
from tests.sim.history import History, ProducerAppend
from tests.sim.world import World


@dataclass
class _Log:
    name: str
    shared: bool  # more than one producer appends to it
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)  # polite producers take turns


@dataclass
class _Producer:
    pid: str
    log: _Log
    in_flight: int  # appends in flight at most
    crash_rate: float  # per append sent: the producer's node dies just after
    resend_last: int | None  # re-send the last N sent (None: every one not acknowledged)
    sent: int = -1  # the highest sequence sent: all below it were sent too
    acked: set[int] = field(default_factory=set)  # sequences seen acknowledged
    life: int = 0  # the node it runs on: killed nodes never come back

    @property
    def node(self) -> str:
        return f"{self.pid}.{self.life}"

    def resend(self) -> list[int]:
        """What to send again, from its own record, in sequence order."""
        unsure = [s for s in range(self.sent + 1) if s not in self.acked]
        if self.resend_last is None:
            return unsure
        low = max(0, self.sent - self.resend_last + 1)
        if unsure:
            low = min(low, unsure[0])
        return list(range(low, self.sent + 1))


@dataclass
class _Session:
    """One writer of a producer, from its open to its end."""

    writer: LogWriter
    failed: bool = False  # an append failed: the writer is done
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def usable(self) -> bool:
        return not self.failed


class Producers:
    def __init__(
        self,
        world: World,
        history: History,
        rng: random.Random,
        pace: float,
        peers: list[str],
    ) -> None:
        self.world = world
        self.history = history
        self.rng = rng
        self.pace = pace  # most seconds between a producer's appends
        self.peers = peers  # the live producer nodes, for the nemesis to partition
        self.producers: list[_Producer] = []
        logs = [f"produced-{i}" for i in range(rng.choice((1, 2)))]
        count = rng.choice((2, 3))
        for index in range(count):
            name = logs[index % len(logs)]
            shared = sum(1 for i in range(count) if logs[i % len(logs)] == name) > 1
            log = next((p.log for p in self.producers if p.log.name == name), None)
            self.producers.append(
                _Producer(
                    f"producer-{index}",
                    log or _Log(name, shared),
                    in_flight=rng.choice((1, 4, 16)),
                    crash_rate=rng.choice((0.01, 0.03)),
                    resend_last=rng.choice((None, None, 1, 8)),
                )
            )
            history.producer_logs.add(name)
        for p in self.producers:
            peers.append(p.node)
            world.trace(
                f"{p.pid}: log {p.log.name}{' (shared)' if p.log.shared else ''}, "
                f"{p.in_flight} in flight, crash rate {p.crash_rate}, re-sends "
                + ("what it did not see acknowledged" if p.resend_last is None
                   else f"its last {p.resend_last}")
            )  # fmt: skip

    def jobs(self, until: float) -> list[Coroutine[Any, Any, None]]:
        return [self._run(p, until) for p in self.producers]

    async def _run(self, p: _Producer, until: float) -> None:
        loop = asyncio.get_running_loop()
        first = True
        while loop.time() < until:
            polite = p.log.shared and self.rng.random() < 0.75
            if polite:
                try:
                    await asyncio.wait_for(p.log.turn.acquire(), until - loop.time())
                except TimeoutError:
                    return
            try:
                await self._session(p, until, resend=not first)
            finally:
                if polite:
                    p.log.turn.release()
            first = False
            await asyncio.sleep(self.rng.uniform(0.01, 0.2))  # a restart, or another's turn

    def _kill(self, p: _Producer, session: _Session | None) -> None:
        """The producer's node dies: it sees nothing more of what it had in flight."""
        in_flight = [] if session is None else [t for t in session.tasks if not t.done()]
        self.world.kill(p.node)
        self.world.trace(f"{p.pid}: died with {len(in_flight)} appends in flight")
        for task in in_flight:
            task.cancel()
        self.peers.remove(p.node)
        p.life += 1
        self.peers.append(p.node)

    async def _session(self, p: _Producer, until: float, resend: bool) -> None:
        loop = asyncio.get_running_loop()
        rng = self.rng
        bk = await self.world.client(p.node, mortal=True)
        opening = asyncio.ensure_future(
            bk.open_log_writer(
                p.log.name, producer_id=p.pid, roll_bytes=rng.choice((300, 3000, 1 << 20))
            )
        )
        if rng.random() < 0.08:  # dies while taking the log
            await asyncio.sleep(rng.uniform(0.0, 0.01))
            if not opening.done():
                self._kill(p, None)
                opening.cancel()
                await asyncio.gather(opening, return_exceptions=True)
                return
        try:
            writer = await opening
        except BKError as exc:
            self.world.trace(f"{p.pid}: cannot open a writer: {type(exc).__name__}: {exc}")
            await asyncio.sleep(0.2)
            return
        self._learnt(p, writer)
        session = _Session(writer)
        again = p.resend() if resend else []
        fresh = itertools.count(p.sent + 1)
        turn = rng.randint(10, 80)  # new sequences before it hands the log on
        slots = asyncio.Semaphore(p.in_flight)
        while loop.time() < until and session.usable():
            if again:
                sequence = again.pop(0)
            elif turn > 0:
                sequence = next(fresh)
                turn -= 1
            else:
                break
            await slots.acquire()
            if not session.usable():
                slots.release()
                break
            value = f"{self.world.seed}:{p.pid}:{sequence}".encode()
            op = ProducerAppend(p.pid, p.log.name, sequence, value, p.node)
            self.history.producer_appends.append(op)
            p.sent = max(p.sent, sequence)
            session.tasks.append(asyncio.create_task(self._send(p, session, op, slots)))
            if rng.random() < p.crash_rate:
                await asyncio.sleep(rng.uniform(0.0, 0.001))  # some on the wire, some acked
                self._kill(p, session)
                await asyncio.gather(*session.tasks, return_exceptions=True)
                return
            await asyncio.sleep(rng.uniform(0, self.pace))
        await asyncio.gather(*session.tasks)
        if not session.failed:
            try:
                await writer.close()
            except BKError as exc:
                self.world.trace(f"{p.pid}: writer close: {type(exc).__name__}")

    def _learnt(self, p: _Producer, writer: LogWriter) -> None:
        """What a writer learns of its producer at open is bounded by the producer's record:
        no higher than it sent, no lower than it saw acknowledged."""
        last = writer.last_sequence
        self.world.trace(
            f"{p.pid}: writing log {p.log.name} from {p.node} (ledger {writer.ledger_id}), "
            f"last sequence {last}, sent up to {p.sent}"
        )
        if not self.world.switches.deduplicate_producers:
            return  # the writer learns nothing then
        if last > p.sent:
            self.history.violations.append(
                f"I17 log {p.log.name}: a writer of {p.pid} learnt last sequence {last}, above "
                f"the highest it ever sent ({p.sent})"
            )
        if p.acked and last < max(p.acked):
            self.history.violations.append(
                f"I17 log {p.log.name}: a writer of {p.pid} learnt last sequence {last}, below "
                f"one acknowledged ({max(p.acked)})"
            )

    async def _send(
        self, p: _Producer, session: _Session, op: ProducerAppend, slots: asyncio.Semaphore
    ) -> None:
        try:
            position = await session.writer.append(op.value, sequence=op.sequence)
        except BKError as exc:
            op.result = "unknown"
            op.error = f"{type(exc).__name__}: {exc}"
            session.failed = True
        except asyncio.CancelledError:
            op.result = "unknown"
            op.error = "the producer died first"
            raise
        else:
            op.result = "ok" if position is not None else "dup"
            if position is not None:
                op.position = (position.ledger_id, position.entry_id)
            p.acked.add(op.sequence)
        finally:
            slots.release()
