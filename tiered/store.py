"""The seam to an object store: what offloading ledgers, reading them back and sweeping
leftovers ask of one.

A store keeps whole objects under string keys (``ledgers/<ledger id>/<uid>.aobk``, under the
prefix its URL names). ``put`` publishes an object only once every byte of it is stored and
durable: before that, readers see no object at all. What a ``put`` cut short by a crash leaves
behind is an ``Upload`` (an S3 multipart upload never completed, a directory store's staging
file); ``uploads`` finds those and ``abort`` removes them, which is how the sweep leaves no
garbage.

Every call either answers or raises ``ObjectStoreError`` (``NoSuchObjectError`` for a missing
object), within the store's own timeout: an unreachable store never holds a caller forever.
The backends are ``MemoryObjectStore`` (tiered/memory.py; the simulator's store builds on it)
and the directory and S3 stores that ``open_object_store`` picks by URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Upload:
    """An upload begun and never completed: the leftover of a ``put`` cut short."""

    key: str  # the object it would have become
    upload_id: str  # the store's name for it (an S3 upload id, a staging file's name)


class ObjectStore(Protocol):
    """An object store, as offloading needs one. Keys are relative to the store's prefix."""

    @property
    def url(self) -> str:
        """The store's URL without credentials: what a ledger's metadata records."""
        ...

    async def put(self, key: str, chunks: AsyncIterable[bytes | bytearray]) -> int:
        """Store the chunks, in order, as the object ``key`` (replacing one already there);
        return its size. The object exists only once complete and durable; a put that fails
        leaves no object, and at most an ``Upload``."""
        ...

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from ``start``: all of them, or ``ObjectStoreError``
        (a range past the end is one). ``NoSuchObjectError`` when ``key`` is absent."""
        ...

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The ``(start, length)`` ranges of ``key``, in the order asked; a store may fetch
        neighbouring ranges in one request."""
        ...

    async def size(self, key: str) -> int | None:
        """The size of ``key`` in bytes; None when there is no such object."""
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``; an absent object is not an error."""
        ...

    def keys(self, prefix: str) -> AsyncIterator[str]:
        """The keys of the complete objects under ``prefix``, in no promised order."""
        ...

    async def uploads(self, prefix: str) -> list[Upload]:
        """The uploads under ``prefix`` begun and never completed or aborted."""
        ...

    async def abort(self, upload: Upload) -> None:
        """Discard an incomplete upload; one already gone is not an error."""
        ...

    async def close(self) -> None:
        """Release the store's connections; the store is not used after."""
        ...


__all__ = ["ObjectStore", "Upload"]
