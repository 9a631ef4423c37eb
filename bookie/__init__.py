"""The aiobk bookie: a storage server with a group-committed journal and ledger storage."""

from bookie.config import BookieConfig, ConfigError
from bookie.disk import Disk, OsDisk
from bookie.entrylog import CorruptEntryError
from bookie.index import IndexCorruptError
from bookie.journal_format import JournalCorruptError
from bookie.journal_policy import GroupCommitPolicy
from bookie.net import AsyncioNetwork, ServerNetwork
from bookie.server import Bookie, BookieAddress, BookieStateError
from bookie.stats import BookieStats

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
