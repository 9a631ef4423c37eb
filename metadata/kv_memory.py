"""``memory://NAME``: an in-process KV with etcd's semantics, shared by name in one process.

Leases expire on the running event loop's clock, so under a virtual-time loop they expire in
virtual time. ``hook`` (if set) is awaited before every write with the operation's name and key:
the simulator uses it to hold a particular compare-and-set at an exact moment.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
from collections.abc import Awaitable, Callable

from aiobk.metadata.kv import (
    KV,
    KeyExistsError,
    KeyMissingError,
    KeyValue,
    RevisionMismatchError,
    Watch,
    WatchCompactedError,
    WatchEvent,
)

WriteHook = Callable[[str, bytes], Awaitable[None]]

_SHARED: dict[str, MemoryKV] = {}
HISTORY = 100_000  # changes kept for watches that start in the past (like etcd before compaction)


class _MemoryWatch(Watch):
    def __init__(self, owner: MemoryKV, key: bytes, prefix: bool) -> None:
        super().__init__()
        self._owner = owner
        self.key = key
        self.prefix = prefix

    def matches(self, key: bytes) -> bool:
        return key.startswith(self.key) if self.prefix else key == self.key

    async def _stop(self) -> None:
        self._owner._watches.pop(self, None)


class _Lease:
    __slots__ = ("expires", "keys", "timer", "ttl")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.keys: set[bytes] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.expires = 0.0


class MemoryKV(KV):
    def __init__(self, name: str = "") -> None:
        self.description = f"memory://{name}"
        self._data: dict[bytes, KeyValue] = {}
        self._sorted: list[bytes] = []
        self._revision = 1
        self._history: list[WatchEvent] = []  # every change, for watches from a past revision
        self._compacted = 0  # history before this revision is gone (``compact``)
        self._watches: dict[_MemoryWatch, None] = {}  # ordered: notified as opened
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 1
        self.hook: WriteHook | None = None

    @classmethod
    def shared(cls, name: str) -> MemoryKV:
        kv = _SHARED.get(name)
        if kv is None:
            kv = _SHARED[name] = cls(name)
        return kv

    @staticmethod
    def forget(name: str) -> None:
        """Drop a shared store (tests)."""
        _SHARED.pop(name, None)

    # ------------------------------------------------------------------ internals

    async def _before_write(self, op: str, key: bytes) -> None:
        if self.hook is not None:
            await self.hook(op, key)

    def _put(self, key: bytes, value: bytes, lease: int) -> int:
        self._revision += 1
        old = self._data.get(key)
        if old is None:
            bisect.insort(self._sorted, key)
        elif old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        if lease:
            holder = self._leases.get(lease)
            if holder is None:
                raise KeyMissingError(f"lease {lease} does not exist")
            holder.keys.add(key)
        self._data[key] = KeyValue(key, value, self._revision, lease)
        self._emit(WatchEvent(key, value, self._revision))
        return self._revision

    def _remove(self, key: bytes) -> None:
        old = self._data.pop(key)
        index = bisect.bisect_left(self._sorted, key)
        del self._sorted[index]
        if old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self._revision += 1
        self._emit(WatchEvent(key, None, self._revision))

    def _emit(self, event: WatchEvent) -> None:
        self._history.append(event)
        if len(self._history) > HISTORY:
            del self._history[: HISTORY // 2]
            self._compacted = self._history[0].revision
        for watch in list(self._watches):
            if watch.matches(event.key):
                watch._push(event)

    # ------------------------------------------------------------------ KV

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        return self._data.get(key), self._revision

    async def create(self, key: bytes, value: bytes, lease: int = 0) -> int:
        await self._before_write("create", key)
        if key in self._data:
            raise KeyExistsError(key.decode(errors="replace"))
        return self._put(key, value, lease)

    async def compare_and_set(self, key: bytes, value: bytes, expected: int, lease: int = 0) -> int:
        await self._before_write("compare_and_set", key)
        current = self._data.get(key)
        if current is None:
            raise KeyMissingError(key.decode(errors="replace"))
        if current.mod_revision != expected:
            raise RevisionMismatchError(key, expected, current.mod_revision)
        return self._put(key, value, lease)

    async def delete(self, key: bytes, expected: int | None = None) -> None:
        await self._before_write("delete", key)
        current = self._data.get(key)
        if current is None:
            raise KeyMissingError(key.decode(errors="replace"))
        if expected is not None and current.mod_revision != expected:
            raise RevisionMismatchError(key, expected, current.mod_revision)
        self._remove(key)

    async def bump(self, key: bytes) -> int:
        await self._before_write("bump", key)
        return self._put(key, b"", 0)

    async def range(
        self,
        prefix: bytes,
        after: bytes | None = None,
        limit: int = 1000,
        *,
        keys_only: bool = False,
        end: bytes | None = None,
    ) -> tuple[list[KeyValue], int]:
        start = bisect.bisect_right(self._sorted, after) if after else 0
        start = max(start, bisect.bisect_left(self._sorted, prefix))
        out: list[KeyValue] = []
        for key in self._sorted[start:]:
            if not key.startswith(prefix) or len(out) >= limit or (end is not None and key >= end):
                break
            found = self._data[key]
            out.append(dataclasses.replace(found, value=b"") if keys_only else found)
        return out, self._revision

    async def compact(self, revision: int) -> None:
        if revision <= self._compacted:
            return
        self._compacted = revision
        self._history = [event for event in self._history if event.revision >= revision]

    async def watch(self, key: bytes, *, prefix: bool, start_revision: int) -> Watch:
        watch = _MemoryWatch(self, key, prefix)
        if start_revision < self._compacted:
            # As etcd: the changes asked for are gone, the watcher must read again.
            watch._push(
                WatchCompactedError(
                    f"watch of {key!r} from revision {start_revision}: compacted to "
                    f"{self._compacted}"
                )
            )
            return watch
        for event in self._history:
            if event.revision >= start_revision and watch.matches(event.key):
                watch._push(event)
        self._watches[watch] = None
        return watch

    # ------------------------------------------------------------------ leases

    def _arm(self, lease_id: int) -> None:
        lease = self._leases[lease_id]
        if lease.timer is not None:
            lease.timer.cancel()
        loop = asyncio.get_running_loop()
        lease.expires = loop.time() + lease.ttl
        lease.timer = loop.call_later(lease.ttl, self._expire, lease_id)

    def _expire(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return
        if lease.timer is not None:
            lease.timer.cancel()
        for key in sorted(lease.keys):
            if key in self._data:
                self._remove(key)

    async def grant_lease(self, ttl: float) -> tuple[int, float]:
        lease_id = self._next_lease
        self._next_lease += 1
        self._leases[lease_id] = _Lease(ttl)
        self._arm(lease_id)
        return lease_id, ttl

    async def keep_alive(self, lease: int) -> float:
        if lease not in self._leases:
            return 0.0
        self._arm(lease)
        return self._leases[lease].ttl

    async def revoke_lease(self, lease: int) -> None:
        self._expire(lease)

    async def lease_time_to_live(self, lease: int) -> tuple[float, float] | None:
        held = self._leases.get(lease)
        if held is None:
            return -1.0, 0.0
        return held.expires - asyncio.get_running_loop().time(), held.ttl

    async def close(self) -> None:
        """Shared by every user of the name: nothing to release (each store closes its watches)."""
