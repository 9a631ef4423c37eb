"""Upgrading a data directory written by an older bookie: the index segments of the format
before the on-disk index (``segments``) and the converter that loads them into the index at
start (``convert``). RocksDB's own one-family layout is converted where RocksDB opens
(``bookie.index.rocks``), not here."""

from aiobk.bookie.upgrade.convert import upgrade_legacy_index

__all__ = ["upgrade_legacy_index"]
