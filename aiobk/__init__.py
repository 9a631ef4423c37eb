"""aiobk: Apache BookKeeper's replicated log protocol, asyncio-native.

The public entry for applications::

    from aiobk import BookKeeper, Durability, Entry, LogPosition, errors

The layers are subpackages: ``aiobk.protocol`` (the pure codec), ``aiobk.metadata`` (ledger
metadata on etcd), ``aiobk.bookie`` (the storage server), ``aiobk.client`` (the async client),
``aiobk.pipeline`` (the PySpark data source) and ``aiobk.bench`` (the benchmarks). This package
itself wires them into the ``aiobk`` command.

The names below load the client on first use, not at ``import aiobk``: a bookie process
(``python -m aiobk.bookie``) never loads the client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiobk.client import (
        BookKeeper,
        ClientConfig,
        Durability,
        Entry,
        LedgerHandle,
        LogPosition,
        LogReader,
        LogWriter,
        ReadHandle,
        errors,
    )

__all__ = [
    "BookKeeper",
    "ClientConfig",
    "Durability",
    "Entry",
    "LedgerHandle",
    "LogPosition",
    "LogReader",
    "LogWriter",
    "ReadHandle",
    "errors",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("aiobk.client"), name)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'aiobk' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
