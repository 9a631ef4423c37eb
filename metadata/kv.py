"""The small key-value interface the metadata store is written against.

Two implementations: ``EtcdKV`` (a real etcd through aetcd) and ``MemoryKV`` (in process, for
tests, notebooks and the simulator). Both give etcd's semantics: every write bumps one global
revision; a key's version for compare-and-set is its ``mod_revision``; leases expire keys;
watches deliver every change after a start revision, in order.

Every call either completes, raises a typed error (``KeyExistsError``, ``KeyMissingError``,
``RevisionMismatchError``) or raises ``MetadataStoreError`` within the configured timeout.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiobk.protocol.errors import MetadataStoreError


class KeyExistsError(Exception):
    """create() found the key already there."""


class KeyMissingError(Exception):
    """A compare-and-set or delete found no key."""


class RevisionMismatchError(Exception):
    """A compare-and-set or delete found the key at another revision."""

    def __init__(self, key: bytes, expected: int, actual: int) -> None:
        super().__init__(f"{key!r} is at revision {actual}, not {expected}")
        self.actual = actual


@dataclass(frozen=True)
class EtcdCredentials:
    """An etcd user (``etcd://USER:PASSWORD@...``, ``aiobk.metadata.uri``); the password is
    kept out of ``repr``. Here, at the seam, so that the URI parser and the etcd twin both
    name it without importing each other."""

    user: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class EtcdTLS:
    """TLS to etcd (``etcds://``, or ``?ca=``/``cert=``/``key=`` on an ``etcd://`` URI): file
    paths, read each time a connection is made (renewed files are picked up at the next
    reconnect). ``ca``: the PEM bundle that signs etcd's certificate (None: the system's
    roots); ``cert`` and ``key``: this client's certificate, for an etcd run with
    ``--client-cert-auth``."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(ca, key, cert) as bytes, in the order gRPC's ``ssl_channel_credentials`` takes
        them; OSError if a file cannot be read."""

        def load(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as handle:
                return handle.read()

        return load(self.ca), load(self.key), load(self.cert)


class WatchCompactedError(MetadataStoreError):
    """A watch asked for changes the store has compacted away (it started, or its broken
    stream resumed, below the compacted revision). Its owner reads the key again and watches
    on from that read (``MetadataStore``'s watches do)."""

    default_message = "the watched changes were compacted away"


class MetadataAuthError(MetadataStoreError):
    """etcd refused who we are, or we refused etcd: wrong user or password, a user missing
    where etcd has auth enabled, an etcd certificate the client does not trust (or a client
    certificate etcd does not). Not retriable: the configuration has to change. Its message
    is one line and never holds a password."""

    retriable = False
    default_message = "etcd refused the credentials"


class MetadataPermissionError(MetadataAuthError):
    """etcd knows the user, but none of its roles grants the keys asked for (the role must
    cover the whole ``/PREFIX/`` range: docs/operations/security.md)."""

    default_message = "etcd: permission denied"


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class WatchEvent:
    key: bytes
    value: bytes | None  # None: deleted
    revision: int


class Watch(abc.ABC):
    """An async iterator of events; ``close()`` stops it (also on ``async with`` exit)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[WatchEvent | BaseException | None] = asyncio.Queue()
        self._closed = False

    def _push(self, item: WatchEvent | BaseException | None) -> None:
        if not self._closed:
            self._queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[WatchEvent]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def next(self, timeout: float) -> WatchEvent:
        """The next event, or TimeoutError."""
        async with asyncio.timeout(timeout):
            item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    async def close(self) -> None:
        if not self._closed:
            self._queue.put_nowait(None)
            self._closed = True
            await self._stop()

    @abc.abstractmethod
    async def _stop(self) -> None: ...

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class KV(abc.ABC):
    """etcd-shaped storage: revisions, compare-and-set, ranges, watches, leases."""

    description: str = ""
    # False from a call that could not reach the store until one that does (etcd's twin; a
    # store in memory is always reached): the ``aiobk_metadata_connected`` gauge.
    connected: bool = True

    @abc.abstractmethod
    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        """The key (or None) and the store revision the read saw."""

    @abc.abstractmethod
    async def create(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Write a key that must not exist; return its revision."""

    @abc.abstractmethod
    async def compare_and_set(self, key: bytes, value: bytes, expected: int, lease: int = 0) -> int:
        """Overwrite a key that must be at revision ``expected``; return the new revision."""

    @abc.abstractmethod
    async def delete(self, key: bytes, expected: int | None = None) -> None:
        """Delete a key (at revision ``expected`` when given); KeyMissingError if absent."""

    @abc.abstractmethod
    async def bump(self, key: bytes) -> int:
        """Write ``key`` unconditionally; return the new store revision (unique, increasing)."""

    @abc.abstractmethod
    async def range(
        self,
        prefix: bytes,
        after: bytes | None = None,
        limit: int = 1000,
        *,
        keys_only: bool = False,
        end: bytes | None = None,
    ) -> tuple[list[KeyValue], int]:
        """Up to ``limit`` keys under ``prefix`` sorted, strictly after ``after`` (and before
        ``end``, if given); + revision. ``keys_only``: values come back empty (a listing of
        ids moves no metadata)."""

    @abc.abstractmethod
    async def watch(self, key: bytes, *, prefix: bool, start_revision: int) -> Watch:
        """Events on ``key`` (or every key under it) from ``start_revision`` on."""

    @abc.abstractmethod
    async def compact(self, revision: int) -> None:
        """Forget the history of changes before ``revision`` (etcd's compaction): watches can no
        longer start earlier (they fail with MetadataStoreError). Compacting to a revision at
        or below one already compacted does nothing. A watch that needs history before it
        fails with ``WatchCompactedError``."""

    @abc.abstractmethod
    async def grant_lease(self, ttl: float) -> tuple[int, float]:
        """A new lease: (id, granted ttl in seconds)."""

    @abc.abstractmethod
    async def keep_alive(self, lease: int) -> float:
        """Refresh a lease; return its remaining ttl (<= 0: the lease is gone)."""

    @abc.abstractmethod
    async def revoke_lease(self, lease: int) -> None:
        """End a lease now; its keys disappear."""

    async def lease_time_to_live(self, lease: int) -> tuple[float, float] | None:
        """(remaining, granted) seconds of a lease (remaining <= 0: it is gone); None when this
        store cannot tell. The time since its holder last refreshed it is about
        ``granted - remaining`` (etcd counts whole seconds)."""
        return None

    @abc.abstractmethod
    async def close(self) -> None: ...


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (etcd's range_end)."""
    data = bytearray(prefix)
    for index in range(len(data) - 1, -1, -1):
        if data[index] < 0xFF:
            data[index] += 1
            return bytes(data[: index + 1])
    return b"\x00"
