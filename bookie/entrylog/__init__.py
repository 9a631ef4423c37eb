"""The entry log family: the format of the append-only files holding every ledger's entries
(``format``), the logs on their way to disk (``buffer``), reading them back (``reads``), the
counts garbage collection keeps of each (``tallies``), and the entry logger that wires them
(``logger``)."""

from aiobk.bookie.entrylog.format import CorruptEntryError
from aiobk.bookie.entrylog.logger import EntryLogger

__all__ = ["CorruptEntryError", "EntryLogger"]
