"""The clients of a run: writers appending unique values with several appends in flight,
tailing readers, and (as a fault) a second client recovering a ledger under a live writer.
Every call is bounded in count and in virtual time.
"""

from __future__ import annotations

import asyncio
import random

from aiobk.client import BookKeeper, Durability, LedgerHandle, LogPosition, LogWriter
from aiobk.protocol.errors import BKError, LogFencedError
from tests.sim.history import Append, History, LogAppend, Observed
from tests.sim.world import World

LOG = "events"  # the run's one log

SHAPES = ((3, 3, 2), (3, 2, 2), (4, 3, 2), (4, 2, 2), (3, 3, 3), (5, 3, 2))


class Workload:
    def __init__(
        self,
        world: World,
        history: History,
        rng: random.Random,
        stall_rate: float = 0.005,
        pace: float = 0.004,
        log_pace: float = 0.01,
        shapes: tuple[tuple[int, int, int], ...] = SHAPES,
    ) -> None:
        self.world = world
        self.shapes = shapes  # the (E, WQ, AQ) a writer's ledger takes, one at random
        self.stall_rate = stall_rate  # chance, per append, that a writer stalls for a while
        self.pace = pace  # most seconds between a writer's appends
        self.log_pace = log_pace  # ... and between a log writer's
        # Set by the loss profiles' plan once its faults are over: writers stop then.
        self.finish: asyncio.Event | None = None
        self.history = history
        self.rng = rng
        self.open_ledgers: list[int] = []
        self.handles: dict[str, LedgerHandle] = {}  # writer -> the ledger it is writing
        self.stalled: dict[str, float] = {}  # writer -> virtual time it resumes appending
        self.fenced_log_writers: set[str] = set()
        # Client nodes besides the writers' that faults may cut off (the producers profile's).
        self.peers: list[str] = []
        # The log writers' roll sizes, one at random (the offload profile's roll often).
        self.roll_bytes: tuple[int, ...] = (200, 2000, 1 << 20)

    def trace(self, text: str) -> None:
        self.world.trace(text)

    def finished(self) -> bool:
        return self.finish is not None and self.finish.is_set()

    async def writer_series(self, name: str, in_flight: int, until: float) -> None:
        """One ledger after another, until ``until`` or the plan's end (the loss profiles:
        ledgers closed while bookies are being lost and repaired)."""
        loop = asyncio.get_running_loop()
        while loop.time() < until and not self.finished():
            if not await self.writer(name, self.rng.randint(20, 150), in_flight, until):
                await asyncio.sleep(1.0)  # no ledger could be made now

    async def writer(self, name: str, entries: int, in_flight: int, until: float) -> bool:
        """Append up to ``entries`` values, until virtual time ``until``; False if no ledger
        could be created."""
        loop = asyncio.get_running_loop()
        bk = await self.world.client(name)
        lh: LedgerHandle | None = None
        volatile = self.rng.random() < 0.2  # BP-14: acknowledged once written
        for _attempt in range(20):
            shape = self.rng.choice(self.shapes)
            if volatile:
                shape = (shape[1], shape[1], shape[2])  # no striping for volatile ledgers
            try:
                lh = await bk.create_ledger(
                    *shape, durability=Durability.VOLATILE if volatile else Durability.PERSISTENT
                )
                break
            except BKError as exc:
                self.trace(f"{name}: create_ledger failed: {type(exc).__name__}")
                await asyncio.sleep(0.2)
        if lh is None:
            return False
        ledger_id = lh.ledger_id
        meta = lh.metadata
        self.history.ledgers[ledger_id] = (meta.ensemble_size, meta.write_quorum, meta.ack_quorum)
        if volatile:
            self.history.volatile.add(ledger_id)
        self.open_ledgers.append(ledger_id)
        self.handles[name] = lh
        self.trace(
            f"{name}: ledger {ledger_id} {meta.ensemble} WQ{meta.write_quorum} AQ{meta.ack_quorum}"
            + (" volatile" if volatile else "")
        )
        slots = asyncio.Semaphore(in_flight)
        tasks: list[asyncio.Task[None]] = []
        for index in range(entries):
            if _failed(lh) or loop.time() > until or self.finished():
                break
            await slots.acquire()
            if _failed(lh):  # it may have failed while we waited for a slot
                slots.release()
                break
            op = Append(ledger_id, f"{self.world.seed}:{ledger_id}:{index}".encode(),
                        asyncio.get_running_loop().time())  # fmt: skip
            self.history.appends.append(op)
            tasks.append(asyncio.create_task(self._append(name, lh, op, slots)))
            resume = self.stalled.pop(name, 0.0)
            if resume > loop.time():
                await asyncio.sleep(resume - loop.time())  # the nemesis hung this writer
            elif self.rng.random() < self.stall_rate:
                stall = self.rng.uniform(0.2, 1.5)
                self.trace(f"{name}: writer stalls {stall:.2f}s")
                await asyncio.sleep(stall)
            else:
                await asyncio.sleep(self.rng.uniform(0, self.pace))
            if volatile and self.rng.random() < 0.05:
                tasks.append(asyncio.create_task(self._force(name, lh)))
        if _failed(lh) and self.rng.random() < 0.5:
            # An application that has not noticed: its next append must be refused unsent,
            # and its value never read (a definite failure in the history).
            await slots.acquire()
            op = Append(ledger_id, f"{self.world.seed}:{ledger_id}:late".encode(), loop.time())
            self.history.appends.append(op)
            tasks.append(asyncio.create_task(self._append(name, lh, op, slots)))
        await asyncio.gather(*tasks)
        self.handles.pop(name, None)
        if lh.error is None and self.rng.random() < 0.6:
            try:
                await lh.close()
                self.trace(f"{name}: closed ledger {ledger_id} at {lh.last_add_confirmed}")
                if volatile:
                    self.history.writer_closed.add(ledger_id)
            except BKError as exc:
                self.trace(f"{name}: close failed: {type(exc).__name__}: {exc}")
            else:
                if self.rng.random() < 0.2:
                    await self._delete(name, bk, ledger_id)
        else:
            self.trace(f"{name}: leaves ledger {ledger_id} open ({lh.error!r})")
        return True

    async def _delete(self, name: str, bk: BookKeeper, ledger_id: int) -> None:
        """Delete a closed ledger: the bookies' garbage collection must reclaim it and nothing
        else. Recorded before the call: a delete that fails may still have happened."""
        self.history.deleted.add(ledger_id)
        try:
            await bk.delete_ledger(ledger_id)
            self.trace(f"{name}: deleted ledger {ledger_id}")
        except BKError as exc:
            self.trace(f"{name}: delete of {ledger_id} failed: {type(exc).__name__}")

    async def _force(self, name: str, lh: LedgerHandle) -> None:
        """BP-14: everything acknowledged before force() began is synced on an ack quorum when
        it returns; the LAC it returns is what the checker then holds the ledger to."""
        try:
            lac = await lh.force()
        except BKError as exc:
            self.trace(f"{name}: force() failed: {type(exc).__name__}")
            return
        self.history.lac(name, lh.ledger_id, lac)

    async def _append(
        self, name: str, lh: LedgerHandle, op: Append, slots: asyncio.Semaphore
    ) -> None:
        try:
            try:
                entry_id, done = await lh.submit(op.value)
            except BKError as exc:  # refused before anything was sent: a definite failure
                op.result = "fail"
                op.error = f"{type(exc).__name__}: {exc}"
                return
            op.entry_id = entry_id
            try:
                await done
                op.result = "ok"
                self.history.lac(name, lh.ledger_id, lh.last_add_confirmed)
            except BKError as exc:  # sent, so it may be stored
                op.result = "unknown"
                op.error = f"{type(exc).__name__}: {exc}"
        finally:
            slots.release()

    async def reader(self, name: str, rounds: int) -> None:
        """Tails whichever ledger exists: LAC reads, long polls and bounded reads."""
        bk = await self.world.client(name)
        for round_ in range(rounds):
            who = f"{name}#{round_}"  # one read handle per round: I9 holds per handle
            await asyncio.sleep(self.rng.uniform(0.05, 0.4))
            if not self.history.ledgers:
                continue
            ledger_id = self.rng.choice(sorted(self.history.ledgers))
            try:
                rh = await bk.open_ledger(ledger_id, recovery=False)
                lac = await rh.read_last_add_confirmed()
                self.history.lac(who, ledger_id, rh.last_add_confirmed)
                if self.rng.random() < 0.3 and not rh.is_closed:
                    lac = await rh.wait_for_lac(lac, timeout=0.5)
                    self.history.lac(who, ledger_id, rh.last_add_confirmed)
                if lac < 0:
                    continue
                first = max(0, lac - self.rng.randrange(8))
                known = rh.last_add_confirmed
                for entry in await rh.read(first, lac):
                    self.history.reads.append(
                        Observed(name, ledger_id, entry.entry_id, bytes(entry.data), known)
                    )
                await rh.close()
            except BKError as exc:
                self.trace(f"{name}: read of {ledger_id} failed: {type(exc).__name__}")

    async def log_writer(self, name: str, until: float, start: float = 0.0) -> None:
        """Appends to the run's log until ``until``; a later log writer takes the log over
        (fencing this one, whose appends then fail) -- that is the point."""
        await asyncio.sleep(start)
        loop = asyncio.get_running_loop()
        bk = await self.world.client(name)
        try:
            writer = await bk.open_log_writer(LOG, roll_bytes=self.rng.choice(self.roll_bytes))
        except BKError as exc:
            self.trace(f"{name}: cannot open log writer: {type(exc).__name__}: {exc}")
            return
        self.trace(f"{name}: writing log {LOG} (ledger {writer.ledger_id})")
        slots = asyncio.Semaphore(self.rng.choice((1, 8)))
        tasks: list[asyncio.Task[None]] = []
        index = 0
        while loop.time() < until and not self.finished():
            await slots.acquire()
            op = LogAppend(name, f"{self.world.seed}:{name}:{index}".encode())
            index += 1
            self.history.log_appends.append(op)
            tasks.append(asyncio.create_task(self._log_append(writer, op, slots)))
            self.history.log_ledgers.add(writer.ledger_id)
            if name in self.fenced_log_writers:
                break  # another writer took the log
            await asyncio.sleep(self.rng.uniform(0, self.log_pace))
        await asyncio.gather(*tasks)
        try:
            await writer.close()
        except BKError as exc:
            self.trace(f"{name}: log writer close: {type(exc).__name__}")

    async def log_retention(self, name: str, until: float, keep: float) -> None:
        """Truncation beside the log's writers, as operators run it: now below a position a
        writer was acknowledged recently (what a consumer has passed), now a retention pass
        that keeps the last ``keep`` seconds of records (found by their timestamps). Neither
        may disturb a writer."""
        loop = asyncio.get_running_loop()
        bk = await self.world.client(name)
        while loop.time() < until and not self.finished():
            await asyncio.sleep(self.rng.uniform(0.2, 1.5))
            try:
                if self.rng.random() < 0.5:
                    acked = [op.position for op in self.history.log_appends if op.result == "ok"]
                    if not acked:
                        continue
                    before: LogPosition | None = LogPosition(*self.rng.choice(acked[-30:]))
                    kind = "truncation"
                else:
                    cutoff = int((loop.time() - keep) * 1000)  # the client's clock is the loop's
                    before = await bk.log_position_at_time(LOG, cutoff)
                    kind = "retention"
                if before is None:
                    continue
                self.history.log_truncations.append(before.ledger_id)
                removed = await bk.truncate_log(LOG, before=before)
                self.history.deleted.update(removed)
                self.trace(f"{name}: {kind} below {before} removed ledgers {removed}")
            except BKError as exc:
                self.trace(f"{name}: truncation failed: {type(exc).__name__}: {exc}")

    async def _log_append(self, writer: LogWriter, op: LogAppend, slots: asyncio.Semaphore) -> None:
        try:
            position = await writer.append(op.value)
            op.result = "ok"
            op.position = (position.ledger_id, position.entry_id)
            self.history.log_ledgers.add(position.ledger_id)
        except BKError as exc:
            op.result = "unknown"
            op.error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, LogFencedError):
                self.fenced_log_writers.add(op.writer)
        finally:
            slots.release()

    async def warm(self, name: str, ledger_id: int) -> None:
        """A would-be recoverer first looks at the ledger (a LAC read): it then has a connection
        to every bookie of the ensemble, so a fault can hit its next request on one."""
        bk = await self.world.client(name)
        try:
            rh = await bk.open_ledger(ledger_id, recovery=False)
            await rh.read_last_add_confirmed()
        except BKError as exc:
            self.trace(f"{name}: LAC read of {ledger_id} failed: {type(exc).__name__}")

    async def recover_one(self, name: str, ledger_id: int | None = None) -> None:
        """A second client recovers (fences and closes) a ledger while its writer may be live."""
        if ledger_id is None:
            live = sorted(h.ledger_id for h in self.handles.values())
            if not live and not self.open_ledgers:
                return
            ledger_id = self.rng.choice(live or self.open_ledgers)
        bk = await self.world.client(name)
        self.trace(f"{name}: recovering ledger {ledger_id}")
        try:
            rh = await bk.open_ledger(ledger_id, recovery=True)
            self.trace(f"{name}: recovered ledger {ledger_id}, last entry {rh.last_add_confirmed}")
            await rh.close()
        except BKError as exc:
            self.trace(f"{name}: recovery of {ledger_id} failed: {type(exc).__name__}: {exc}")


def _failed(lh: LedgerHandle) -> bool:
    return lh.error is not None
