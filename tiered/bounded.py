"""What the directory and S3 stores share: every call bounded by the store's timeout, obstore's
and the operating system's errors turned into the store errors of the seam, keys checked, and
a streamed ``put`` whose stall (not its caller's pace) is what the timeout bounds.

Nothing from obstore, botocore or the operating system reaches a caller of a store: a missing
object is ``NoSuchObjectError``, every other failure ``ObjectStoreError`` with one line naming
the store (its URL without secrets) and the operation.
"""

from __future__ import annotations

import asyncio
import atexit
import re
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import obstore
from obstore.store import ObjectStore as ObstoreStore

from aiobk.protocol.errors import NoSuchObjectError, ObjectStoreError

T = TypeVar("T")

# A staging file's suffix (obstore's LocalStore and the directory store name theirs KEY#N); a key
# ending so would be taken for one.
STAGING_SUFFIX = re.compile(r"#[0-9]+$")
# A store's error says what failed in one line of at most this many characters of the client's
# own words (an S3 error's first line carries the whole XML answer).
MESSAGE_LIMIT = 300


def check_key(url: str, key: str) -> str:
    """``key`` when it names an object: relative, '/'-separated, no empty, '.' or '..' part, no
    staging suffix; ValueError otherwise."""
    parts = key.split("/")
    if not key or any(part in {"", ".", ".."} for part in parts) or "\\" in key:
        raise ValueError(f"{url}: {key!r} is not an object key")
    if STAGING_SUFFIX.search(key) or "\0" in key:
        raise ValueError(f"{url}: {key!r} is not an object key")
    return key


def first_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says (obstore's errors carry a debug dump after it)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= MESSAGE_LIMIT else f"{line[:MESSAGE_LIMIT]}..."


def translate(url: str, operation: str, exc: BaseException) -> ObjectStoreError:
    """The store error for a failure of ``operation``."""
    if isinstance(exc, ObjectStoreError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return NoSuchObjectError(f"{url}: {operation}: no such object")
    return ObjectStoreError(f"{url}: {operation} failed: {first_line(exc)}")


@asynccontextmanager
async def bounded(url: str, operation: str, timeout: float) -> AsyncIterator[None]:
    """Run the body within ``timeout`` seconds; its failures become store errors."""
    try:
        async with asyncio.timeout(timeout):
            yield
    except TimeoutError:
        raise ObjectStoreError(f"{url}: {operation}: no answer within {timeout:g} s") from None
    except (ObjectStoreError, ValueError, StopAsyncIteration):  # the end of a listing
        raise
    except Exception as exc:
        raise translate(url, operation, exc) from None


def check_range(url: str, key: str, start: int, length: int) -> None:
    """Refuse a range no object has (a negative start or length)."""
    if start < 0 or length < 0:
        raise ObjectStoreError(f"{url}: range {start}+{length} of {key!r} is not a range")


def checked(url: str, key: str, start: int, length: int, data: bytes) -> bytes:
    """``data`` when it is the whole range asked; a short read means the object ends first."""
    if len(data) != length:
        raise ObjectStoreError(
            f"{url}: range {start}+{length} of {key!r} is past its end ({len(data)} bytes read)"
        )
    return data


def parent(prefix: str) -> str | None:
    """The directory part of a key prefix (``ledgers/12`` -> ``ledgers``): what a listing by
    path must start from so that every key beginning with ``prefix`` is in it."""
    head, _, _ = prefix.rpartition("/")
    return head or None


async def read_ranges(
    url: str, store: ObstoreStore, key: str, ranges: Sequence[tuple[int, int]], timeout: float
) -> list[bytes]:
    """The ``(start, length)`` ranges of ``key`` through obstore (which coalesces neighbours),
    each checked whole: obstore answers a range running past the end with fewer bytes."""
    for start, length in ranges:
        check_range(url, key, start, length)
    asked = [(start, length) for start, length in ranges if length]
    async with bounded(url, f"get {key}", timeout):
        if len(asked) < len(ranges):  # an empty range: the object must exist and reach it
            end = int((await in_thread(obstore.head, store, key))["size"])
            for start, length in ranges:
                if not length and start > end:
                    checked(url, key, start, 1, b"")
        got = await in_thread(
            obstore.get_ranges,
            store,
            key,
            starts=[s for s, _ in asked],
            lengths=[n for _, n in asked],
        )
    found = iter(got)
    return [
        checked(url, key, start, length, bytes(next(found)) if length else b"")
        for start, length in ranges
    ]


async def in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """obstore's synchronous call in a worker thread. Its ``*_async`` calls hand their result
    back from obstore's own runtime threads into the event loop; one still running when its
    caller gave up (a timeout) or when the process exits can touch a loop or an interpreter
    that is gone, which aborts the process (seen here: about one short-lived process in five
    under load). A thread's late answer is simply dropped."""
    return await asyncio.to_thread(function, *args, **kwargs)


async def call(url: str, operation: str, timeout: float, awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, bounded and translated as ``bounded`` does."""
    async with bounded(url, operation, timeout):
        return await awaitable


_NO_TIME = 1e-6  # seconds: a deadline this close has passed


class StreamedPut:
    """A ``put`` that hands the caller's chunks to a store client which pulls them (obstore's
    ``put_async``), bounded by how long the store goes without asking for the next chunk or
    finishing: the caller's own pace (entries read from bookies) is not the store's stall.

    A chunk source that raises an ``Exception`` lets the client abort its upload. One cut short
    by any other ``BaseException`` (the crash tests' stand-in for a killed process) stops the
    client where it stands, as a kill would, so the incomplete upload stays for ``uploads``.
    """

    def __init__(
        self, url: str, key: str, timeout: float, chunks: AsyncIterable[bytes | bytearray]
    ) -> None:
        self._url, self._key, self._timeout = url, key, timeout
        self._chunks = chunks
        self._loop = asyncio.get_running_loop()
        self._in_caller = False
        self._since = self._loop.time()  # when the store last got something to do
        self._size = 0
        self._killed: BaseException | None = None
        self._failed: Exception | None = None
        self._stopped = asyncio.Event()
        self._released = asyncio.Event()

    async def feed(self) -> AsyncIterator[bytes | bytearray]:
        """The chunks, as the client pulls them."""
        iterator = aiter(self._chunks)
        while True:
            self._in_caller = True
            try:
                chunk = await anext(iterator)
            except StopAsyncIteration:
                break
            except Exception as exc:  # the source's own failure, for the caller as it is
                self._failed = exc
                raise
            except BaseException as exc:  # a stand-in for a kill: the upload must stay
                self._killed = exc
                self._stopped.set()
                await self._released.wait()  # the client is gone by then: nothing aborts
                raise
            finally:
                self._in_caller = False
                self._since = self._loop.time()
            self._size += len(chunk)
            yield chunk

    async def run(
        self, start: Callable[[AsyncIterator[bytes | bytearray]], Awaitable[object]]
    ) -> int:
        """Run the client's put (``start(feed)``) to its end; the object's size."""
        task = asyncio.ensure_future(start(self.feed()))
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            while not task.done():
                wait = self._timeout
                if not self._in_caller:
                    wait = self._since + self._timeout - self._loop.time()
                    if wait <= _NO_TIME:  # a wait this short may not move a clock at all
                        raise ObjectStoreError(
                            f"{self._url}: put {self._key}: no answer within {self._timeout:g} s"
                        )
                await asyncio.wait({task, stopped}, timeout=wait, return_when="FIRST_COMPLETED")
                if self._killed is not None:
                    break
            if self._killed is not None:
                task.cancel()
                await asyncio.wait({task})
                raise self._killed
            try:
                task.result()
            except (ObjectStoreError, ValueError):
                raise
            except Exception as exc:
                if exc is self._failed:
                    raise
                raise translate(self._url, f"put {self._key}", exc) from None
            return self._size
        finally:
            for pending in (task, stopped):
                pending.cancel()
            self._released.set()
            await asyncio.wait({task, stopped})
            if not task.cancelled():
                task.exception()  # retrieved: raised above, or superseded by what is raised


# Stores whose obstore client is still held. Their clients are dropped at exit, while the
# interpreter is whole: a client dropped during finalization can leave obstore's runtime
# threads touching Python state that is already gone, which aborts the process (the class of
# failure lancedb/lancedb#4175 describes for a shared Tokio runtime).
_HELD: weakref.WeakSet[ObstoreCalls] = weakref.WeakSet()


def _drop_held_clients() -> None:
    for store in list(_HELD):
        store._drop_client()


atexit.register(_drop_held_clients)


class ObstoreCalls:
    """The calls the directory and S3 stores make the same way through obstore: reads of
    ranges, sizes, deletions and listings, each bounded and translated, and closing. A store
    sets ``_url`` (without secrets) and ``_timeout``, and its client with ``_hold``."""

    _url: str
    _store: ObstoreStore
    _timeout: float

    def _hold(self, client: ObstoreStore) -> None:
        self._store = client
        _HELD.add(self)

    def _drop_client(self) -> None:
        self.__dict__.pop("_store", None)
        _HELD.discard(self)

    async def close(self) -> None:
        """Drop the obstore client (its pooled connections with it); the store is not used
        after."""
        self._drop_client()

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        (data,) = await self.get_ranges(key, [(start, length)])
        return data

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        path = check_key(self._url, key)
        return await read_ranges(self._url, self._store, path, ranges, self._timeout)

    async def size(self, key: str) -> int | None:
        path = check_key(self._url, key)
        try:
            async with bounded(self._url, f"size {key}", self._timeout):
                meta = await in_thread(obstore.head, self._store, path)
        except NoSuchObjectError:
            return None
        return int(meta["size"])

    async def delete(self, key: str) -> None:
        path = check_key(self._url, key)
        try:
            async with bounded(self._url, f"delete {key}", self._timeout):
                await in_thread(obstore.delete, self._store, path)
        except NoSuchObjectError:
            return

    async def _listed(self, prefix: str, start: str | None) -> AsyncIterator[str]:
        """The keys under ``prefix`` of obstore's listing from ``start``, a page at a time."""
        stream = iter(obstore.list(self._store, start, chunk_size=1000))
        while True:
            async with bounded(self._url, f"list {prefix}", self._timeout):
                page = await in_thread(next, stream, None)
            if page is None:
                return
            for meta in page:
                if meta["path"].startswith(prefix):
                    yield meta["path"]


__all__ = [
    "ObstoreCalls",
    "STAGING_SUFFIX",
    "StreamedPut",
    "bounded",
    "call",
    "check_key",
    "check_range",
    "checked",
    "first_line",
    "parent",
    "read_ranges",
    "translate",
]
