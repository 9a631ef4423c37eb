"""The aiobk async client."""

import typing as _typing
import warnings as _warnings

from aiobk.client import errors
from aiobk.client.bookkeeper import BookKeeper
from aiobk.client.config import ClientConfig, ProtocolSwitches
from aiobk.client.connection import BookieConnection
from aiobk.client.digest import Digester
from aiobk.client.entry import Entry
from aiobk.client.ledger_handle import LedgerHandle
from aiobk.client.log.format import ENVELOPE, RAW, RecordFormatError
from aiobk.client.log.position import LogPosition, LogRecord
from aiobk.client.log.reader import LogReader
from aiobk.client.log.writer import LogWriter, LogWriterSettings
from aiobk.client.net import AsyncioConnector, Connector
from aiobk.client.read_handle import ReadHandle
from aiobk.protocol import DigestType, Durability

__all__ = [
    "AsyncioConnector",
    "BookKeeper",
    "BookieConnection",
    "ClientConfig",
    "Connector",
    "DigestType",
    "Digester",
    "Durability",
    "ENVELOPE",
    "Entry",
    "LedgerHandle",
    "LogPosition",
    "LogRecord",
    "LogReader",
    "LogWriter",
    "LogWriterSettings",
    "ProtocolSwitches",
    "RAW",
    "ReadHandle",
    "RecordFormatError",
    "errors",
]


def __getattr__(name: str) -> _typing.Any:
    if name == "LogEntry":
        _warnings.warn(
            "aiobk.client.LogEntry is deprecated: the class is LogRecord",
            DeprecationWarning,
            stacklevel=2,
        )
        return LogRecord
    raise AttributeError(f"module 'aiobk.client' has no attribute {name!r}")
