"""The soak's log writer, a service of its own: ``python -m tests.soak.writer --metadata URI``.

It calls ``append`` at a steady pace -- one call every 1/rate s, in sequence order, at most
``--in-flight`` unanswered (past that the next call waits for a free slot) -- with records that
carry their sequence number (``service.payload``), and reports each acknowledgement as
``acked: [sequence, ledger, entry, latency_us, wall_time]`` and each failure as ``failed:
[sequence, generation, error]``. A writer that failed is replaced by a new one (the service
restarts it, as a supervisor would; ``reopened``), which takes the log over; its records carry
the next sequence numbers. Nothing failed is appended again.

On stop it makes no more calls, waits for those in flight, closes the writer and reports
``done`` with the number of calls made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

from aiobk.client import BookKeeper, LogWriter
from aiobk.protocol.errors import BKError
from tests.soak.service import Reporter, common_arguments, payload, run_service

APPEND_BOUND = 120.0  # an append unanswered this long is reported failed (a hang)
OPEN_BOUND = 60.0  # one attempt at opening the writer
CLOSE_BOUND = 60.0
DRAIN_BOUND = 150.0  # at the stop, for the calls in flight
REOPEN_BACKOFF = 1.0
# Behind the pace by more than this (the in-flight slots were all taken), the pace starts again
# from now rather than catching up in a burst.
MAX_LAG = 0.25


async def open_writer(
    bk: BookKeeper, args: argparse.Namespace, reporter: Reporter, stop: asyncio.Event
) -> LogWriter | None:
    """A writer of the log, retried until it opens or the service stops (None)."""
    while not stop.is_set():
        try:
            async with asyncio.timeout(OPEN_BOUND):
                return await bk.open_log_writer(args.log, roll_bytes=args.roll_bytes)
        except (BKError, TimeoutError) as exc:
            reporter.emit("open_failed", repr(exc))
            await asyncio.sleep(REOPEN_BACKOFF)
    return None


async def main(args: argparse.Namespace, reporter: Reporter, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    period = 1.0 / args.rate
    async with BookKeeper(args.metadata) as bk:
        writer = await open_writer(bk, args, reporter, stop)
        if writer is None:
            reporter.emit("done", {"called": 0, "unresolved": []})
            return
        reporter.emit("ready", {"ledger": writer.ledger_id})
        generation = 0
        broken = False
        slots = asyncio.Semaphore(args.in_flight)
        in_flight: dict[int, asyncio.Task[None]] = {}

        async def call(target: LogWriter, made_by: int, sequence: int) -> None:
            nonlocal broken
            started = loop.time()
            try:
                async with asyncio.timeout(APPEND_BOUND):
                    position = await target.append(payload(sequence, args.record_size))
            except (BKError, TimeoutError) as exc:
                reporter.add("failed", [sequence, made_by, repr(exc)])
                broken |= made_by == generation
            else:
                latency = round((loop.time() - started) * 1e6)
                reporter.add(
                    "acked",
                    [sequence, position.ledger_id, position.entry_id, latency,
                     round(time.time(), 3)],
                )  # fmt: skip
            finally:
                slots.release()
                in_flight.pop(sequence, None)

        sequence = 0
        due = loop.time()
        while not stop.is_set():
            await slots.acquire()
            if stop.is_set():
                slots.release()
                break
            now = loop.time()
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > MAX_LAG:
                due = now
            due += period
            if broken:
                with contextlib.suppress(BKError, TimeoutError):
                    async with asyncio.timeout(CLOSE_BOUND):
                        await writer.close()
                fresh = await open_writer(bk, args, reporter, stop)
                if fresh is None:
                    slots.release()
                    break
                writer, generation, broken = fresh, generation + 1, False
                reporter.emit("reopened", {"generation": generation, "ledger": writer.ledger_id})
            # Tasks start in the order they are created: the calls reach append() in sequence.
            in_flight[sequence] = loop.create_task(call(writer, generation, sequence))
            sequence += 1
        if in_flight:
            await asyncio.wait(list(in_flight.values()), timeout=DRAIN_BOUND)
        unresolved = sorted(in_flight)
        for task in list(in_flight.values()):
            task.cancel()
        try:
            async with asyncio.timeout(CLOSE_BOUND):
                await writer.close()
        except (BKError, TimeoutError) as exc:
            reporter.emit("close_failed", repr(exc))
        reporter.emit("done", {"called": sequence, "unresolved": unresolved})


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.writer")
    common_arguments(parser)
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--roll-bytes", type=int, default=256 * 1024)
    return parser


if __name__ == "__main__":
    run_service(main, parser())
