"""The data source's options, parsed once, and the one place it connects to the cluster.

Options: ``metadata`` (the metadata URI, required), ``log`` (a log name) or ``ledgers``
(comma-separated ledger ids, batch read only), ``password`` (default empty), ``split`` (most
entries per read partition, default 100000: a big ledger is read by several tasks),
``startingPosition`` (streaming: ``earliest``, default, or ``latest``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiobk.client import BookKeeper

SCHEMA = "log string, ledger_id long, entry_id long, data binary"
DEFAULT_SPLIT = 100_000

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    metadata: str
    log: str
    ledgers: tuple[int, ...]
    password: bytes
    split: int
    start: str

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        metadata = options.get("metadata", "")
        if not metadata:
            raise ValueError("the aiobk data source needs .option('metadata', 'etcd://...')")
        log = options.get("log", "")
        ledgers = tuple(int(x) for x in options.get("ledgers", "").split(",") if x.strip())
        if not log and not ledgers:
            raise ValueError("the aiobk data source needs .option('log', NAME) or 'ledgers'")
        split = int(options.get("split", DEFAULT_SPLIT))
        if split < 1:
            raise ValueError("option 'split' must be positive")
        start = options.get("startingPosition", "earliest").lower()
        if start not in ("earliest", "latest"):
            raise ValueError("option 'startingPosition' must be 'earliest' or 'latest'")
        return cls(metadata, log, ledgers, options.get("password", "").encode(), split, start)

    def run(self, action: Callable[[BookKeeper], Awaitable[T]]) -> T:
        """Connect, run ``action`` and close, from Spark's synchronous callbacks (driver or
        executor): every piece of work the source does goes through here, one connection each."""

        async def main() -> T:
            async with await BookKeeper.connect(self.metadata) as bk:
                return await action(bk)

        return asyncio.run(main())


__all__ = ["DEFAULT_SPLIT", "SCHEMA", "Options"]
