"""aiobk: Apache BookKeeper's replicated log protocol, asyncio-native.

The public entry for applications::

    from aiobk import BookKeeper, Durability, Entry, LogPosition, LogRecord, errors

The layers are subpackages: ``aiobk.protocol`` (the pure codec), ``aiobk.metadata`` (ledger
metadata on etcd), ``aiobk.bookie`` (the storage server), ``aiobk.client`` (the async client),
``aiobk.pipeline`` (the PySpark data source) and ``aiobk.bench`` (the benchmarks). This package
itself wires them into the ``aiobk`` command.

The names below load the client on first use, not at ``import aiobk``: a bookie process
(``python -m aiobk.bookie``) never loads the client. ``__version__`` is the installed
distribution's version.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from aiobk.client import (
        BookKeeper,
        ClientConfig,
        Durability,
        Entry,
        LedgerHandle,
        LogPosition,
        LogReader,
        LogRecord,
        LogWriter,
        ReadHandle,
        errors,
    )

    __version__: str

__all__ = [
    "BookKeeper",
    "ClientConfig",
    "Durability",
    "Entry",
    "LedgerHandle",
    "LogPosition",
    "LogReader",
    "LogRecord",
    "LogWriter",
    "ReadHandle",
    "errors",
]


def _installed_version() -> str:
    from importlib import metadata  # noqa: PLC0415 - only when asked: it takes tens of ms to import

    try:
        return metadata.version("aiobk")
    except metadata.PackageNotFoundError:  # imported from a checkout that was never installed
        return "0+unknown"


def __getattr__(name: str) -> _typing.Any:
    if name in __all__:
        value = getattr(_importlib.import_module("aiobk.client"), name)
    elif name == "__version__":
        value = _installed_version()
    else:
        raise AttributeError(f"module 'aiobk' has no attribute {name!r}")
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    """The public API only (``__all__`` and ``__version__``)."""
    return sorted([*__all__, "__version__"])
