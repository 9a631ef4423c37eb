"""The soak's churn, a service of its own: ``python -m tests.soak.churn --metadata URI``.

Every ``--interval`` s it creates a small ledger, writes it (``--entries`` records of
``--record-size`` bytes), closes it, and deletes the oldest of those it keeps (``--keep``), so
the bookies' entry logs interleave live and dead data all the time: garbage collection has
ledgers to reclaim and compaction logs to rewrite. It reports its counts after each round
(``churn``); an operation that fails is counted and retried at a later round (a ledger not
deleted stays in the queue), never fatal.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections import deque

from aiobk.client import BookKeeper
from aiobk.protocol.errors import BKError, NoSuchLedgerError
from tests.soak.service import Reporter, common_arguments, payload, run_service

ROUND_BOUND = 60.0  # one round's create, writes and close


async def main(args: argparse.Namespace, reporter: Reporter, stop: asyncio.Event) -> None:
    rng = random.Random(args.seed)
    loop = asyncio.get_running_loop()
    counts = {"created": 0, "entries": 0, "deleted": 0, "errors": 0}
    last_error = ""
    alive: deque[int] = deque()
    async with BookKeeper(args.metadata) as bk:
        reporter.emit("ready", {})
        due = loop.time()
        while not stop.is_set():
            due += args.interval
            try:
                async with asyncio.timeout(ROUND_BOUND):
                    handle = await bk.create_ledger(3, 3, 2)
                    alive.append(handle.ledger_id)
                    counts["created"] += 1
                    entries = rng.randint(args.min_entries, args.max_entries)
                    data = payload(handle.ledger_id, args.record_size)
                    await asyncio.gather(*(handle.append(data) for _ in range(entries)))
                    counts["entries"] += entries
                    await handle.close()
            except (BKError, TimeoutError) as exc:
                counts["errors"] += 1
                last_error = repr(exc)
            while len(alive) > args.keep:
                try:
                    async with asyncio.timeout(ROUND_BOUND):
                        await bk.delete_ledger(alive[0])
                except NoSuchLedgerError:
                    pass
                except (BKError, TimeoutError) as exc:
                    counts["errors"] += 1
                    last_error = repr(exc)
                    break
                alive.popleft()
                counts["deleted"] += 1
            reporter.emit("churn", {**counts, "alive": len(alive), "last_error": last_error})
            try:
                async with asyncio.timeout(max(0.0, due - loop.time())):
                    await stop.wait()
            except TimeoutError:
                pass


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.churn")
    common_arguments(parser)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--keep", type=int, default=8)
    parser.add_argument("--min-entries", type=int, default=16)
    parser.add_argument("--max-entries", type=int, default=128)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    return parser


if __name__ == "__main__":
    run_service(main, parser())
