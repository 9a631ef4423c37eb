"""The aiobk async client."""

from aiobk.client import errors
from aiobk.client.bookkeeper import BookKeeper
from aiobk.client.config import ClientConfig, ProtocolSwitches
from aiobk.client.connection import BookieConnection
from aiobk.client.digest import Digester
from aiobk.client.entry import Entry
from aiobk.client.ledger_handle import LedgerHandle
from aiobk.client.log_format import ENVELOPE, RAW, RecordFormatError
from aiobk.client.log_position import LogEntry, LogPosition, LogRecord
from aiobk.client.log_reader import LogReader
from aiobk.client.log_writer import LogWriter, LogWriterSettings
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
    "LogEntry",
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
