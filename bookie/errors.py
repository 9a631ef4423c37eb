"""The bookie's own errors (beside ``ConfigError``, in ``bookie.config``, and the storage ones:
``IndexCorruptError``, ``JournalCorruptError``, ``CorruptEntryError``)."""

from __future__ import annotations


class BookieStateError(RuntimeError):
    """``start``/``stop`` called in the wrong state, or an operation that needs a running
    bookie."""


__all__ = ["BookieStateError"]
