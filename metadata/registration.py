"""A bookie's registration: its service info under a lease kept alive in the background.

The lease is refreshed every third of its TTL. If a refresh finds the lease gone (it expired
while the bookie could not reach the store, or somebody revoked it), or refreshes keep failing
for longer than the TTL, the registration is lost: ``lost`` is set and every ``on_lost``
callback runs, so the owner can stop taking writes or register again. ``close()`` revokes the
lease (a clean deregistration); ``abandon()`` stops refreshing and lets it expire (a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiobk.metadata.kv import KV
from aiobk.metadata.records import BookieServiceInfo
from aiobk.protocol.errors import MetadataStoreError

log = logging.getLogger(__name__)


class Registration:
    def __init__(self, kv: KV, key: bytes, info: BookieServiceInfo, lease: int, ttl: float) -> None:
        self._kv = kv
        self._key = key
        self.info = info
        self.lease = lease
        self.ttl = ttl
        self.lost = asyncio.Event()
        self._updating = asyncio.Lock()
        self._callbacks: list[Callable[[Registration], None]] = []
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            self._keep_alive(), name=f"lease-{info.bookie_id}"
        )

    def on_lost(self, callback: Callable[[Registration], None]) -> None:
        self._callbacks.append(callback)

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                remaining = await self._kv.keep_alive(self.lease)
            except MetadataStoreError as exc:
                if loop.time() - last_ok < self.ttl:
                    log.warning("bookie %s: lease refresh failed: %s", self.info.bookie_id, exc)
                    continue
                self._lose(f"no refresh for {self.ttl:g}s ({exc})")
                return
            if remaining <= 0:
                self._lose("the lease expired")
                return
            last_ok = loop.time()

    def _lose(self, why: str) -> None:
        log.error("bookie %s lost its registration: %s", self.info.bookie_id, why)
        self._task = None
        self.lost.set()
        for callback in self._callbacks:
            callback(self)

    async def update(self, info: BookieServiceInfo) -> None:
        """Publish new service info (free disk, read-only) under the same lease. Updates run
        one at a time: two at once would race their own compare-and-set."""
        async with self._updating:
            current, _revision = await self._kv.get(self._key)
            if current is None or current.lease != self.lease:
                raise MetadataStoreError(f"registration of {info.bookie_id} is gone")
            await self._kv.compare_and_set(
                self._key, info.to_json(), current.mod_revision, self.lease
            )
            self.info = info

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        """Deregister now (clean stop). If the store is unreachable the lease expires anyway."""
        await self._stop()
        if not self.lost.is_set():
            with contextlib.suppress(MetadataStoreError):
                await self._kv.revoke_lease(self.lease)

    async def abandon(self) -> None:
        """Stop refreshing without deregistering: the entry disappears when the lease expires."""
        await self._stop()
