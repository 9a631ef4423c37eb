"""The chaos run's producer: an application appending to a log with sequences, as processes
(tests/support/producer.py) that the run SIGKILLs one after another while the nemesis works on
the bookies. Each next process opens a writer with the same producer id and sends again from
the first sequence no process has seen acknowledged -- now and then from further back, as an
application replaying from an older checkpoint does; inside a process, a writer lost to the
faults is replaced the same way. After the run a last process goes past the highest sequence
sent and exits by itself.

The check (``check``): the log holds the producer's sequences 0..N once each and in order (P1),
every acknowledged sequence at the position it was acknowledged at (P2), each record's payload
the one sent with its sequence (P3), and every process ended as the run ended it (P4).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

from aiobk.client import BookKeeper, LogPosition
from aiobk.protocol.errors import BKError
from tests.support.producer import ProducerProcess, payload

LOG = "chaos-producer"
PRODUCER = "p0"
LIFE = (0.5, 2.5)  # seconds a process appends before the run kills it
REWIND = 50  # sequences sent again from below the first unsure one, by one restart in three
ROLL_BYTES = 64 * 1024  # the log rolls every 700 records or so, amid the faults too
PAST = 100  # the last process goes this far past the highest sequence sent
FIRST_LINE_BOUND = 30.0  # seconds a process has to open its first writer (5 past the run's end)
FINISH_BOUND = 90.0  # seconds the last process has to finish
READ_ATTEMPTS = 20  # the check's read of the log, tried again a second apart


class ChaosProducer:
    def __init__(
        self, uri: str, base: Path, rng: random.Random, note: Callable[[str], None]
    ) -> None:
        self.uri = uri
        self.stderr = base / "producer.log"
        self.rng = rng
        self.note = note
        self.runs: list[ProducerProcess] = []
        self.kills = 0
        self.records = 0
        self.violations: list[str] = []

    def _resume(self) -> int:
        """The first sequence no process has seen durable (acknowledged, or found in the log),
        or sometimes REWIND before it."""
        known: set[int] = set()
        for run in self.runs:
            known |= set(run.acked) | set(run.dups)
        first = 0
        while first in known:
            first += 1
        if self.runs and self.rng.random() < 1 / 3:
            first = max(0, first - REWIND)
        return first

    def _process(self, start: int, end: int = -1) -> ProducerProcess:
        process = ProducerProcess(
            self.uri, LOG, PRODUCER, start=start, end=end, roll_bytes=ROLL_BYTES, timeout=2.0,
            stderr=self.stderr,
        )  # fmt: skip
        self.runs.append(process)
        return process

    async def run(self, deadline: float) -> None:
        """Processes killed one after another until ``deadline``, then the last one, which
        ends by itself."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            process = self._process(self._resume())
            await process.launch()
            try:
                bound = min(FIRST_LINE_BOUND, max(1.0, deadline - loop.time() + 5.0))
                await process.until(process.opened, bound)
                life = min(self.rng.uniform(*LIFE), max(0.0, deadline - loop.time()))
                await process.until(lambda: False, life)
            except (TimeoutError, AssertionError):
                pass  # its time is up, or it ended by itself (judged below)
            finally:
                process.kill()
            code = await process.wait()
            if code == -9:
                self.kills += 1
                self.note(
                    f"producer killed: {len(process.acked)} acknowledged, last sent "
                    f"{max(process.sent, default=-1)}, writer reopened {len(process.reopened)}x"
                )
            else:
                self.violations.append(f"P4 a producer process exited by itself with {code}")
        high = max((max(run.sent, default=-1) for run in self.runs), default=-1)
        last = self._process(self._resume(), high + 1 + PAST)
        await last.launch()
        try:
            async with asyncio.timeout(FINISH_BOUND):
                code = await last.wait()
        except TimeoutError:
            last.kill()
            code = await last.wait()
        if code != 0 or not last.done:
            self.violations.append(f"P4 the last producer process did not finish: exit {code}")
        self.note(f"producer finished at sequence {high + PAST}")

    def kill(self) -> None:
        """Any process still running (a run that failed part-way)."""
        for run in self.runs:
            if run.running:
                run.kill()

    async def check(self, bk: BookKeeper) -> list[str]:
        for attempt in range(READ_ATTEMPTS):
            try:
                reader = await bk.open_log_reader(LOG, follow=False)
                records = [record async for record in reader]
                break
            except BKError as exc:
                if attempt == READ_ATTEMPTS - 1:
                    return [*self.violations, f"P1 the producer's log cannot be read: {exc!r}"]
                await asyncio.sleep(1.0)
        self.records = len(records)
        violations = list(self.violations)
        sequences = [r.sequence if r.producer_id == PRODUCER else None for r in records]
        for index, sequence in enumerate(sequences):
            if sequence != index:
                violations.append(
                    f"P1 record {index} of the log ({records[index].position}) holds sequence "
                    f"{sequence}: not each sequence once, in order"
                )
                break
        at = {record.position: record for record in records}
        for run in self.runs:
            for sequence, (ledger_id, entry_id) in sorted(run.acked.items()):
                record = at.get(LogPosition(ledger_id, entry_id))
                if record is None or record.sequence != sequence:
                    violations.append(
                        f"P2 sequence {sequence}, acknowledged at {ledger_id}:{entry_id}, is "
                        f"not there (found {record})"
                    )
                    break
        for record in records:
            if record.sequence is not None and record.data != payload(record.sequence):
                violations.append(f"P3 record at {record.position}: another sequence's payload")
                break
        sent = max(self.runs[-1].sent, default=-1) if self.runs else -1
        if (sequences[-1] if sequences else -1) != sent:
            violations.append(f"P1 the log ends at {sequences[-1:]}, the last process sent {sent}")
        return violations

    def summary(self) -> str:
        acked = set().union(*(run.acked for run in self.runs)) if self.runs else set()
        return (
            f"producer: {len(self.runs)} processes ({self.kills} killed), "
            f"{sum(len(run.reopened) for run in self.runs)} writers lost to faults and reopened, "
            f"{len(acked)} sequences acknowledged, "
            f"{sum(len(run.dups) for run in self.runs)} sent again and found in the log, "
            f"{self.records} in the log"
        )
