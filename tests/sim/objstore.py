"""The simulator's object store: ``MemoryObjectStore`` on virtual time, with the faults a real
store has, for the offload profile (tests.sim.offload).

Every call takes a seeded latency and is bounded by the store's timeout exactly as the
directory and S3 stores bound theirs (``aiobk.tiered.bounded``: ``bounded`` for a call,
``StreamedPut`` for a put, whose stall and not its caller's pace is what the timeout bounds).
The faults, set by the nemesis and undone by ``heal``:

- ``failure_rate``: a call fails with ``ObjectStoreError`` now and then;
- ``stalls``: the next calls hang until healed -- only the caller's timeout ends them;
- ``tears``: the next puts are cut short part-way, leaving an ``Upload`` as an S3 multipart
  upload left incomplete does;
- ``lost``: the store is unreachable, every call refused.

A put whose caller is cancelled (its process crashed: ``World.crash`` cancels an auditor's
tasks) leaves its ``Upload`` too. ``hook`` sees every call and every part of a put before it
runs, with the name of the node calling (``client``), for the nemesis to crash that node
mid-offload. No wall clock, no global random: a run replays from its seed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from aiobk.protocol.errors import ObjectStoreError
from aiobk.tiered.bounded import StreamedPut, bounded
from aiobk.tiered.memory import MemoryObjectStore
from aiobk.tiered.store import ObjectStore, Upload

T = TypeVar("T")
URL = "file:///sim/objects"  # the cluster's offload store, as its settings name it
TIMEOUT = 2.0  # virtual seconds a call may take: what a stall runs into
Hook = Callable[[str, str, str], Awaitable[None]]  # (caller, operation, key)


class SimObjectStore(MemoryObjectStore):
    """One store shared by the whole simulated cluster; each node reaches it through
    ``client(node)``."""

    def __init__(
        self,
        rng: random.Random,
        trace: Callable[[str], None],
        *,
        url: str = URL,
        timeout: float = TIMEOUT,
        latency: float = 0.02,
    ) -> None:
        super().__init__(url)
        self.rng = rng
        self.trace = trace
        self.timeout = timeout
        self.latency = latency  # upper bound of one call's (or one part's) latency
        self.failure_rate = 0.0
        self.stalls = 0
        self.tears = 0
        self.lost = False
        self.hook: Hook | None = None
        self._healed: asyncio.Event | None = None
        self.calls: dict[str, int] = {}  # operation -> calls begun
        self.failed: dict[str, int] = {}  # what each fault did

    def client(self, caller: str) -> ObjectStore:
        """The store as node ``caller`` reaches it."""
        return _Client(self, caller)

    def opener(self, caller: str) -> Callable[[str], ObjectStore]:
        """What a ``StoreCache`` of node ``caller`` opens URLs with: this store for its URL, a
        one-line ValueError (as ``open_object_store`` gives) for any other."""

        def open_store(url: str) -> ObjectStore:
            if url != self.url:
                raise ValueError(f"{url}: not an object store of the simulated cluster")
            return self.client(caller)

        return open_store

    def heal(self) -> None:
        """Every fault undone; stalled calls go on (their callers have timed out by then)."""
        self.failure_rate = 0.0
        self.tears = 0
        self.lost = False
        self.hook = None
        self.unstall()

    def unstall(self) -> None:
        """Stalled calls go on; calls to come no longer stall."""
        self.stalls = 0
        if self._healed is not None:
            self._healed.set()
            self._healed = None

    def _count(self, table: dict[str, int], name: str) -> None:
        table[name] = table.get(name, 0) + 1

    async def _gate(self, caller: str, operation: str, key: str) -> None:
        """What one call (or one part of a put) meets before the data: the hook, the
        network's latency, then whichever fault is set."""
        if self.hook is not None:
            await self.hook(caller, operation, key)
        await asyncio.sleep(self.rng.uniform(0.0, self.latency))
        if self.lost:
            self._count(self.failed, "refused")
            raise ObjectStoreError(f"{self.url}: {operation} {key}: connection refused")
        if self.stalls > 0:
            self.stalls -= 1
            self._count(self.failed, "stalled")
            self.trace(f"objects: {caller}'s {operation} {key} stalls")
            if self._healed is None:
                self._healed = asyncio.Event()
            await self._healed.wait()
        if self.failure_rate and self.rng.random() < self.failure_rate:
            self._count(self.failed, "failed")
            raise ObjectStoreError(f"{self.url}: {operation} {key}: 503 slow down")

    async def call(
        self, caller: str, operation: str, key: str, run: Callable[[], Awaitable[T]]
    ) -> T:
        self._count(self.calls, operation)
        async with bounded(self.url, f"{operation} {key}", self.timeout):
            await self._gate(caller, operation, key)
            return await run()

    async def put_from(
        self, caller: str, key: str, chunks: AsyncIterable[bytes | bytearray]
    ) -> int:
        """A put as the real stores make one: streamed, its stalls bounded by the timeout."""
        self._count(self.calls, "put")

        async def store(feed: AsyncIterator[bytes | bytearray]) -> int:
            return await self._upload(caller, key, feed)

        return await StreamedPut(self.url, key, self.timeout, chunks).run(store)

    async def _upload(self, caller: str, key: str, feed: AsyncIterator[bytes | bytearray]) -> int:
        """The store's side of a put: each part after the gate. A tear or a cancelled caller
        leaves the ``Upload``; a failure of the caller's chunks aborts it."""
        self._next_upload += 1
        upload_id = f"upload-{self._next_upload}"
        parts: list[bytes] = []
        self._uploads[upload_id] = (key, parts)
        torn = self.tears > 0 and self.rng.random() < 0.7
        if torn:
            self.tears -= 1
        try:
            await self._gate(caller, "put", key)
            async for chunk in feed:
                await self._gate(caller, "put part", key)
                parts.append(bytes(chunk))
                if torn and parts:
                    self._count(self.failed, "torn")
                    self.trace(f"objects: {caller}'s put {key} torn after {len(parts)} part(s)")
                    raise _Torn
        except _Torn:
            raise ObjectStoreError(f"{self.url}: put {key}: connection reset mid-upload") from None
        except Exception:
            del self._uploads[upload_id]
            raise
        del self._uploads[upload_id]
        data = b"".join(parts)
        self.objects[key] = data
        return len(data)

    def unfinished(self) -> list[Upload]:
        """Every upload begun and never completed or aborted (for the checker)."""
        return [Upload(key, upload_id) for upload_id, (key, _) in sorted(self._uploads.items())]


class _Torn(Exception):
    """A put cut short by the store: a signal inside ``_upload``, never raised out of it."""


class _Client:
    """``SimObjectStore`` as one node reaches it: every call through its gate."""

    def __init__(self, store: SimObjectStore, caller: str) -> None:
        self._store = store
        self._caller = caller

    @property
    def url(self) -> str:
        return self._store.url

    async def put(self, key: str, chunks: AsyncIterable[bytes | bytearray]) -> int:
        return await self._store.put_from(self._caller, key, chunks)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        store = self._store
        return await store.call(
            self._caller, "get", key, lambda: MemoryObjectStore.get_range(store, key, start, length)
        )

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        store = self._store
        return await store.call(
            self._caller, "get", key, lambda: MemoryObjectStore.get_ranges(store, key, ranges)
        )

    async def size(self, key: str) -> int | None:
        store = self._store
        return await store.call(
            self._caller, "head", key, lambda: MemoryObjectStore.size(store, key)
        )

    async def delete(self, key: str) -> None:
        store = self._store
        store.trace(f"objects: {self._caller} deletes {key}")
        await store.call(self._caller, "delete", key, lambda: MemoryObjectStore.delete(store, key))

    async def keys(self, prefix: str) -> AsyncIterator[str]:
        store = self._store

        async def listing() -> list[str]:
            return [key async for key in MemoryObjectStore.keys(store, prefix)]

        for key in await store.call(self._caller, "list", prefix, listing):
            yield key

    async def uploads(self, prefix: str) -> list[Upload]:
        store = self._store
        return await store.call(
            self._caller, "list uploads", prefix, lambda: MemoryObjectStore.uploads(store, prefix)
        )

    async def abort(self, upload: Upload) -> None:
        store = self._store
        await store.call(
            self._caller, "abort", upload.key, lambda: MemoryObjectStore.abort(store, upload)
        )

    async def close(self) -> None:
        return None  # the store outlives every node's cache of it


__all__ = ["TIMEOUT", "URL", "SimObjectStore"]
