"""The bookie's index family: the engine seam (``engine``: ``IndexDb``, ``IndexBatch``), the
engines behind it (``rocks``: RocksDB, the bookie extra's, imported lazily; ``twin``: a simple
log-structured engine that writes through the bookie's ``Disk`` seam, for the simulator), and
the key layout of ledgers and entry locations over any engine (``entry_index``)."""

from aiobk.bookie.index.engine import IndexBatch, IndexCorruptError, IndexDb
from aiobk.bookie.index.entry_index import EntryIndex

__all__ = ["EntryIndex", "IndexBatch", "IndexCorruptError", "IndexDb"]
