"""The aiobk async client (API.md "Client API")."""

from client import errors
from client.bookkeeper import BookKeeper
from client.config import ClientConfig, ProtocolSwitches
from client.connection import BookieConnection
from client.digest import Digester
from client.entry import Entry
from client.ledger_handle import LedgerHandle
from client.log_position import LogEntry, LogPosition
from client.log_reader import LogReader
from client.log_writer import LogWriter, LogWriterSettings
from client.net import AsyncioConnector, Connector
from client.read_handle import ReadHandle
from protocol import DigestType, Durability

__all__ = [
    "AsyncioConnector",
    "BookKeeper",
    "BookieConnection",
    "ClientConfig",
    "Connector",
    "DigestType",
    "Digester",
    "Durability",
    "Entry",
    "LedgerHandle",
    "LogEntry",
    "LogPosition",
    "LogReader",
    "LogWriter",
    "LogWriterSettings",
    "ProtocolSwitches",
    "ReadHandle",
    "errors",
]
