"""The journal family: the group-committed write-ahead log (``journal``: the queue and the
writer stage), its sync stage (``sync``), its files (``files``), the batches and callbacks the
stages hand each other (``batch``), its record format (``format``), the pure policy that decides
when a batch starts and where it is written (``policy``), and the replay that reads it back
after a restart (``replay``)."""

from aiobk.bookie.journal.batch import JournalFailedError
from aiobk.bookie.journal.format import JournalCorruptError, Record, RecordType
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.journal.policy import GroupCommitPolicy

__all__ = [
    "GroupCommitPolicy",
    "Journal",
    "JournalCorruptError",
    "JournalFailedError",
    "Record",
    "RecordType",
]
