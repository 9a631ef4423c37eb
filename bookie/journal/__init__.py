"""The journal family: the group-committed write-ahead log (``journal``), its record format
(``format``), the pure policy that decides when a batch starts and where it is written
(``policy``), and the replay that reads it back after a restart (``replay``)."""

from aiobk.bookie.journal.format import JournalCorruptError, Record, RecordType
from aiobk.bookie.journal.journal import Journal, JournalFailedError
from aiobk.bookie.journal.policy import GroupCommitPolicy

__all__ = [
    "GroupCommitPolicy",
    "Journal",
    "JournalCorruptError",
    "JournalFailedError",
    "Record",
    "RecordType",
]
