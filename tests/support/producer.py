"""A producer as a process of its own, for tests that SIGKILL the application that appends, not
only the bookies: ``python -m tests.support.producer`` opens a log writer with a producer id and
appends dense sequences with a window of appends in flight, telling its parent on stdout (one
flushed line each) what it sent and what was acknowledged; ``ProducerProcess`` starts it and
keeps that record, which is all a test may know of a producer it killed.

The program is the retrying producer an application would write: when its writer fails (the
faults took every ledger it could move to), it opens another with the same producer id and
sends again from the first sequence it is unsure of; the writer's ``last_sequence`` makes the
ones already durable no-ops (``dup``). Given an end, it closes its writer once every sequence
before it is durable and prints ``done``; without one it runs until it is killed.

Lines: ``last_sequence L`` (the first writer opened), ``sent S``, ``ack S LEDGER ENTRY``,
``dup S`` (not appended again), ``reopened L`` (a later writer, after a failure), ``done``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from aiobk.client import BookKeeper, ClientConfig, LogPosition, LogWriter
from aiobk.protocol.errors import BKError

REPO = Path(__file__).resolve().parents[2]
OPEN_ATTEMPTS = 600  # a writer that cannot be opened is tried again every 0.1 s, this often


def payload(sequence: int, size: int = 64) -> bytes:
    """What the producer appends as ``sequence``: a reader checks a record against it."""
    return (b"%010d:" % sequence).ljust(size, b".")


# ---------------------------------------------------------------- the program


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def open_writer(bk: BookKeeper, args: argparse.Namespace) -> LogWriter:
    for _attempt in range(OPEN_ATTEMPTS - 1):
        try:
            return await bk.open_log_writer(
                args.log, producer_id=args.producer, roll_bytes=args.roll_bytes
            )
        except BKError:
            await asyncio.sleep(0.1)  # a backoff: the old writer may still hold the log
    return await bk.open_log_writer(args.log, producer_id=args.producer, roll_bytes=args.roll_bytes)


async def produce(args: argparse.Namespace) -> None:
    config = ClientConfig(add_timeout=args.timeout, read_timeout=args.timeout)
    async with await BookKeeper.connect(args.metadata, config) as bk:
        writer = await open_writer(bk, args)
        emit(f"last_sequence {writer.last_sequence}")
        following = args.start
        while True:
            following = await send(writer, following, args)
            if following < 0:
                break
            with contextlib.suppress(BKError):
                await writer.close()
            writer = await open_writer(bk, args)
            emit(f"reopened {writer.last_sequence}")
        await writer.close()
    emit("done")


async def send(writer: LogWriter, sequence: int, args: argparse.Namespace) -> int:
    """Send ``sequence`` on until ``args.end`` (-1 once all settled), or until the writer
    fails: then the first sequence whose append is not known to be durable."""
    window = asyncio.Semaphore(args.window)
    unsure: set[int] = set()
    failed = asyncio.Event()

    async def one(number: int) -> None:
        try:
            position = await writer.append(payload(number, args.size), sequence=number)
        except BKError:
            failed.set()
            return
        finally:
            window.release()
        unsure.discard(number)
        if isinstance(position, LogPosition):
            emit(f"ack {number} {position.ledger_id} {position.entry_id}")
        else:
            emit(f"dup {number}")

    tasks: set[asyncio.Task[None]] = set()
    while (args.end < 0 or sequence < args.end) and not failed.is_set():
        await window.acquire()
        if failed.is_set():
            break
        unsure.add(sequence)
        emit(f"sent {sequence}")
        task = asyncio.create_task(one(sequence))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sequence += 1
    await asyncio.gather(*tasks)
    if failed.is_set():
        return min(unsure, default=sequence)
    return -1


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.producer")
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--producer", required=True)
    parser.add_argument("--start", type=int, default=0, help="the first sequence to send")
    parser.add_argument("--end", type=int, default=-1, help="stop before it (-1: never)")
    parser.add_argument("--window", type=int, default=32, help="appends in flight")
    parser.add_argument("--roll-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--size", type=int, default=64, help="payload bytes")
    parser.add_argument("--timeout", type=float, default=30.0, help="add and read timeouts")
    uvloop.run(produce(parser.parse_args()))


# ---------------------------------------------------------------- the parent's side


@dataclass
class ProducerProcess:
    """One run of the program, and what it said before it ended (a SIGKILL ends it between
    any two lines: the pipe still holds every line printed before)."""

    metadata: str
    log: str
    producer: str
    start: int = 0
    end: int = -1
    window: int = 32
    roll_bytes: int = 256 * 1024 * 1024
    timeout: float = 30.0
    stderr: Path | None = None  # where its warnings go (None: the parent's stderr)
    last_sequence: int | None = None  # as the first writer learnt it
    sent: list[int] = field(default_factory=list)
    acked: dict[int, tuple[int, int]] = field(default_factory=dict)  # sequence: its position
    dups: list[int] = field(default_factory=list)
    reopened: list[int] = field(default_factory=list)
    done: bool = False
    returncode: int | None = None

    def __post_init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._reading: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    async def launch(self) -> None:
        argv = [
            sys.executable, "-m", "tests.support.producer", "--metadata", self.metadata,
            "--log", self.log, "--producer", self.producer, "--start", str(self.start),
            "--end", str(self.end), "--window", str(self.window),
            "--roll-bytes", str(self.roll_bytes), "--timeout", str(self.timeout),
        ]  # fmt: skip
        with contextlib.ExitStack() as stack:
            errors = None if self.stderr is None else stack.enter_context(self.stderr.open("ab"))
            self._process = await asyncio.create_subprocess_exec(
                *argv, cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=errors,
            )  # fmt: skip
        self._reading = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        async for raw in self._process.stdout:
            word, *rest = raw.decode().split()
            numbers = [int(n) for n in rest]
            if word == "last_sequence":
                self.last_sequence = numbers[0]
            elif word == "sent":
                self.sent.append(numbers[0])
            elif word == "ack":
                self.acked[numbers[0]] = (numbers[1], numbers[2])
            elif word == "dup":
                self.dups.append(numbers[0])
            elif word == "reopened":
                self.reopened.append(numbers[0])
            elif word == "done":
                self.done = True
            self._changed.set()
        self._changed.set()

    async def until(self, condition: Callable[[], bool], timeout: float) -> None:
        """Until ``condition()`` holds (checked at each line), or AssertionError once the
        program has ended or ``timeout`` has passed without it."""
        async with asyncio.timeout(timeout):
            while not condition():
                assert self._reading is not None
                if self._reading.done():
                    raise AssertionError(f"the producer ended first (exit {await self.wait()})")
                self._changed.clear()
                await self._changed.wait()

    def kill(self) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        """Its exit code, once it has exited and every line it printed has been read."""
        assert self._process is not None
        assert self._reading is not None
        self.returncode = await self._process.wait()
        await self._reading
        return self.returncode

    def opened(self) -> bool:
        """Its first writer is open (it said ``last_sequence``)."""
        return self.last_sequence is not None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def unsure(self) -> set[int]:
        """Sent, and neither acknowledged nor found already in the log."""
        return set(self.sent) - set(self.acked) - set(self.dups)


if __name__ == "__main__":
    main()
