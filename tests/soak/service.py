"""What the soak's services (writer, reader, churn; each ``python -m tests.soak.<name>``) share.

A service talks to the harness through its standard streams: it reports events as JSON lines
on stdout (``Reporter``), batched every ``FLUSH_EVERY`` s, and stops when its stdin reaches
its end (``stop_on_eof``): the harness closes it to stop a service, and a harness that dies
closes it too, so no service outlives it. Its log goes to stderr (a file of the harness's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

FLUSH_EVERY = 0.1


def payload(sequence: int, size: int) -> bytes:
    """The record of ``sequence``: its 8-byte big-endian number, repeated to ``size`` bytes
    (rounded down to a multiple of 8), so a record read back is checked whole."""
    return sequence.to_bytes(8, "big") * max(1, size // 8)


def sequence_of(data: bytes) -> tuple[int, bool]:
    """The sequence a record carries, and whether the record is intact."""
    if len(data) < 8:
        return -1, False
    sequence = int.from_bytes(data[:8], "big")
    return sequence, data == payload(sequence, len(data))


class Reporter:
    """Events as JSON lines on stdout: ``emit`` at once, ``add`` batched under one key."""

    def __init__(self) -> None:
        self._batches: dict[str, list[Any]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._flusher())

    def emit(self, kind: str, body: Any) -> None:
        self.flush()
        self._write({kind: body})

    def add(self, kind: str, item: Any) -> None:
        self._batches.setdefault(kind, []).append(item)

    def flush(self) -> None:
        batches, self._batches = self._batches, {}
        for kind, items in batches.items():
            self._write({kind: items})

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.flush()

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            self.flush()

    @staticmethod
    def _write(event: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
        sys.stdout.flush()


_watchers: set[asyncio.Task[None]] = set()


def stop_on_eof() -> asyncio.Event:
    """An event set once stdin yields a line (``stop``) or reaches its end."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def watch() -> None:
        reader = asyncio.StreamReader()
        try:
            transport, _protocol = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
            )
        except (OSError, ValueError):
            stop.set()
            return
        try:
            await reader.readline()
        finally:
            transport.close()
            stop.set()

    task = loop.create_task(watch())
    _watchers.add(task)
    task.add_done_callback(_watchers.discard)
    return stop


def common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--log", default="soak")
    parser.add_argument("--log-level", default="warning")


def run_service(
    main: Callable[[argparse.Namespace, Reporter, asyncio.Event], Awaitable[None]],
    parser: argparse.ArgumentParser,
) -> None:
    args = parser.parse_args()
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )  # fmt: skip

    async def service() -> None:
        reporter = Reporter()
        reporter.start()
        stop = stop_on_eof()
        try:
            await main(args, reporter, stop)
        finally:
            await reporter.stop()

    uvloop.run(service())
