"""A lease kept alive in the background: what a bookie's registration, the auditor's election
and a replication worker's claims hang their keys on.

The lease is refreshed every third of its TTL. If a refresh finds it gone (it expired while the
holder could not reach the store, or somebody revoked it), or refreshes keep failing for longer
than the TTL, the lease is lost: ``lost`` is set and every ``on_lost`` callback runs, so the
holder stops acting on what the lease stood for. ``close()`` revokes it (its keys go at once);
``abandon()`` stops refreshing and lets it expire (a crash, as the store sees it).

A lost lease is a fact the holder learns late: between the expiry and the holder noticing, a
successor may already act. Nothing that must not happen twice may rest on a lease alone; every
change that matters is a compare-and-set on the version its maker read (Jepsen's etcd 3.4.3
analysis: etcd locks are not safe on their own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiobk.metadata.kv import KV
from aiobk.protocol.errors import MetadataStoreError
from aiobk.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class HeldLease:
    def __init__(self, kv: KV, lease: int, ttl: float, name: str) -> None:
        self._kv = kv
        self.id = lease
        self.ttl = ttl
        self.name = name
        self.lost = asyncio.Event()
        self._callbacks: list[Callable[[HeldLease], None]] = []
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            self._keep_alive(), name=f"lease-{name}"
        )

    @classmethod
    async def grant(cls, kv: KV, ttl: float, name: str) -> HeldLease:
        lease, granted = await kv.grant_lease(ttl)
        return cls(kv, lease, granted, name)

    def on_lost(self, callback: Callable[[HeldLease], None]) -> None:
        self._callbacks.append(callback)

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                remaining = await self._kv.keep_alive(self.id)
            except Exception as exc:  # whatever it is, the loop must not end unheard
                if not isinstance(exc, MetadataStoreError):
                    log.warning("%s: lease refresh raised %r", self.name, exc, exc_info=exc)
                if loop.time() - last_ok < self.ttl:
                    log.warning("%s: lease refresh failed: %s", self.name, exc)
                    continue
                self._lose(f"no refresh for {self.ttl:g}s ({exc})")
                return
            if remaining <= 0:
                self._lose("the lease expired")
                return
            last_ok = loop.time()

    def _lose(self, why: str) -> None:
        log.error("%s lost its lease: %s", self.name, why)
        self._task = None
        self.lost.set()
        for callback in self._callbacks:
            callback(self)

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def close(self) -> None:
        """Revoke now. If the store is unreachable the lease expires anyway."""
        await self._stop()
        if not self.lost.is_set():
            with contextlib.suppress(MetadataStoreError):
                await self._kv.revoke_lease(self.id)

    async def abandon(self) -> None:
        """Stop refreshing without revoking: the keys go when the lease expires."""
        await self._stop()


__all__ = ["HeldLease"]
