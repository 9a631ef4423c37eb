"""The aiobk bookie: a storage server with a group-committed journal and ledger storage."""

from aiobk.bookie.config import BookieConfig, ConfigError
from aiobk.bookie.disk import Disk, OsDisk
from aiobk.bookie.entrylog.format import CorruptEntryError
from aiobk.bookie.errors import BookieStateError
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.bookie.journal.format import JournalCorruptError
from aiobk.bookie.journal.policy import GroupCommitPolicy
from aiobk.bookie.net import AsyncioNetwork, ServerNetwork
from aiobk.bookie.server import Bookie, BookieAddress
from aiobk.bookie.stats import BookieStats

__all__ = [
    "Bookie",
    "BookieAddress",
    "BookieConfig",
    "BookieStateError",
    "BookieStats",
    "ConfigError",
    "CorruptEntryError",
    "Disk",
    "GroupCommitPolicy",
    "IndexCorruptError",
    "JournalCorruptError",
    "OsDisk",
    "AsyncioNetwork",
    "ServerNetwork",
]
