"""A bookie's registration: its service info under a lease kept alive in the background
(``metadata.lease``).

If the lease is lost (it expired while the bookie could not reach the store, somebody revoked
it, or refreshes failed for longer than the TTL), the registration is lost: ``lost`` is set and
every ``on_lost`` callback runs, so the owner can stop taking writes or register again.
``close()`` revokes the lease (a clean deregistration); ``abandon()`` stops refreshing and lets
it expire (a crash).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiobk.metadata.kv import KV
from aiobk.metadata.lease import HeldLease
from aiobk.metadata.records import BookieServiceInfo
from aiobk.protocol.errors import MetadataStoreError


class Registration:
    def __init__(self, kv: KV, key: bytes, info: BookieServiceInfo, lease: int, ttl: float) -> None:
        self._kv = kv
        self._key = key
        self.info = info
        self._lease = HeldLease(kv, lease, ttl, f"bookie {info.bookie_id}")
        self.lease = lease
        self.ttl = ttl
        self.lost = self._lease.lost
        self._updating = asyncio.Lock()

    def on_lost(self, callback: Callable[[Registration], None]) -> None:
        self._lease.on_lost(lambda _lease: callback(self))

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

    async def close(self) -> None:
        """Deregister now (clean stop). If the store is unreachable the lease expires anyway."""
        await self._lease.close()

    async def abandon(self) -> None:
        """Stop refreshing without deregistering: the entry disappears when the lease expires."""
        await self._lease.abandon()
