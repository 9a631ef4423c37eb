"""The bookie in the registry: registered under a lease when it starts serving, kept
there while it runs, its writable/read-only state and free disk published as they change.

A lease that is lost (etcd unreachable past the TTL) makes clients stop picking this bookie;
the bookie keeps trying to register again every ``REREGISTER_INTERVAL`` while it runs.

``Registry`` is one life's registration; ``Membership`` is the bookie's side of it across
lives: what it publishes (its identity, free disk, writable or not), and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from aiobk.bookie.write_state import WriteState
from aiobk.metadata import (
    DEFAULT_RACK,
    READ_ONLY,
    WRITABLE,
    BookieServiceInfo,
    MetadataStore,
    Registration,
)
from aiobk.protocol.errors import BKError, MetadataStoreError

REREGISTER_INTERVAL = 1.0  # seconds between attempts to register again after losing the lease
REPUBLISH_FREE_BYTES = 64 * 1024 * 1024  # free disk moved this much: publish it again

log = logging.getLogger(__name__)

# (free bytes, total bytes, writable) of the moment.
Usage = Callable[[], Awaitable[tuple[int, int, bool]]]


class Registry:
    """This bookie's registration (one per bookie life)."""

    def __init__(
        self,
        store: MetadataStore,
        ttl: float,
        identity: BookieServiceInfo,
        usage: Usage,
        running: Callable[[], bool],
    ) -> None:
        """``identity``: what is published (id, address, version, instance); state and disk
        figures are filled in from ``usage`` each time."""
        self.store = store
        self.ttl = ttl
        self.identity = identity
        self._usage = usage
        self._running = running
        self.registration: Registration | None = None
        self._published_free = 0
        self._published_state = WRITABLE
        self._reregister_task: asyncio.Task[None] | None = None
        self._publish_task: asyncio.Task[None] | None = None
        self._replaced: tuple[str, ...] = ()

    async def _service_info(self) -> BookieServiceInfo:
        free, total, writable = await self._usage()
        self._published_free = free
        self._published_state = WRITABLE if writable else READ_ONLY
        return dataclasses.replace(
            self.identity, state=self._published_state, free_bytes=free, total_bytes=total
        )

    async def register(self, replaced_instances: tuple[str, ...] = ()) -> None:
        """Publish this bookie under a lease; ``replaced_instances``: earlier instances of its
        id whose registrations this one may take over (a fixed cookie)."""
        self._replaced = replaced_instances
        registration = await self.store.register_bookie(
            await self._service_info(), self.ttl, replaced_instances
        )
        registration.on_lost(self._on_lost)
        self.registration = registration

    def _on_lost(self, lost: Registration) -> None:
        if self._running() and self._reregister_task is None:
            self._reregister_task = asyncio.get_running_loop().create_task(self._reregister())

    async def _reregister(self) -> None:
        """Keep trying to register again; clients cannot pick this bookie meanwhile. Not once
        its cookie in the metadata is gone or names another instance: while the lease was
        lost (a process paused, a partition) an operator decommissioned this bookie, or a
        replacement took its id; registering again would offer clients a bookie the cluster
        let go (it stays out of the registry until restarted, where boot checks the cookie)."""
        try:
            while self._running():
                try:
                    if not await self._cookie_is_ours():
                        log.error(
                            "bookie %s: its cookie in the metadata is gone or belongs to "
                            "another instance (decommissioned, or replaced) while its "
                            "registration was lost: not registering again; restart it to "
                            "check its cookies",
                            self._owner(),
                        )
                        return
                    await self.register(self._replaced)
                    log.info("bookie %s registered again", self._owner())
                    return
                except (MetadataStoreError, BKError) as exc:
                    log.warning("bookie %s: cannot register yet: %s", self._owner(), exc)
                await asyncio.sleep(REREGISTER_INTERVAL)
        finally:
            self._reregister_task = None

    async def _cookie_is_ours(self) -> bool:
        cookie = await self.store.read_cookie(self._owner())
        instance = self.identity.instance_id
        return cookie is not None and (not instance or cookie.instance_id == instance)

    def _owner(self) -> str:
        return self.identity.bookie_id

    async def refresh(self) -> None:
        """Publish free disk again when it moved by more than 64 MiB, and a change between
        writable and read-only that could not be published when it happened."""
        registration = self.registration
        if registration is None or registration.lost.is_set():
            return
        free, _total, writable = await self._usage()
        state = WRITABLE if writable else READ_ONLY
        if (
            abs(free - self._published_free) >= REPUBLISH_FREE_BYTES
            or state != self._published_state
        ):
            await registration.update(await self._service_info())

    async def publish(self) -> None:
        """``refresh``, never raising: the next round tries again."""
        try:
            await self.refresh()
        except Exception as exc:
            log.warning("bookie %s: cannot publish its state yet: %s", self._owner(), exc)

    def publish_soon(self) -> None:
        """A change between writable and read-only: published at once, in the background
        (placement reads the registry)."""
        if self._publish_task is None or self._publish_task.done():
            self._publish_task = asyncio.get_running_loop().create_task(
                self.publish(), name="bookie-publish-state"
            )

    async def close(self, clean: bool) -> None:
        """Leave the registry: at once when ``clean``, else as a killed process would (the
        lease lapses)."""
        for name in ("_reregister_task", "_publish_task"):
            task: asyncio.Task[None] | None = getattr(self, name)
            setattr(self, name, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        registration, self.registration = self.registration, None
        if registration is not None:
            await (registration.close() if clean else registration.abandon())


class Membership:
    """A bookie in the registry: a ``Registry`` for each life it serves with a store."""

    def __init__(
        self,
        metadata: Callable[[], MetadataStore | None],
        ttl: float,
        version: str,
        disk_usage: Callable[[], Awaitable[tuple[int, int]]],
        write_state: WriteState,
        owner: Callable[[], str],
        running: Callable[[], bool],
        rack: str = DEFAULT_RACK,
    ) -> None:
        """``metadata``: the bookie's store (None: it has none, or not yet); ``version``: its
        software's; ``disk_usage``: free and total bytes of its data directory; ``owner``: its
        id; ``running``: whether it serves; ``rack``: its failure domain."""
        self._metadata = metadata
        self._ttl = ttl
        self._version = version
        self._disk_usage = disk_usage
        self._write_state = write_state
        self._owner = owner
        self._running = running
        self._rack = rack
        self._registry: Registry | None = None

    @property
    def registration(self) -> Registration | None:
        """This bookie's lease in the registry, while it holds one."""
        return self._registry.registration if self._registry is not None else None

    async def register(self, address: str, instance_id: str, replaced: tuple[str, ...]) -> None:
        """Publish this bookie under a lease, so clients can pick it while it runs.

        Args:
            address: Its advertised address.
            instance_id: The id of its data (its cookies').
            replaced: Earlier instances of its id whose registrations it may take over.
        """
        store = self._metadata()
        if store is None:
            return
        identity = BookieServiceInfo(
            self._owner(),
            address,
            software_version=self._version,
            instance_id=instance_id,
            rack=self._rack,
        )
        self._registry = Registry(store, self._ttl, identity, self._usage, self._running)
        await self._registry.register(replaced)

    async def _usage(self) -> tuple[int, int, bool]:
        free, total = await self._disk_usage()
        return free, total, self._write_state.writable

    async def publish(self) -> None:
        """Publish free disk and state again when they moved (``Registry.publish``)."""
        if self._registry is not None:
            await self._registry.publish()

    def state_changed(self, writable: bool) -> None:
        """Writable or read-only: registered as such at once (placement reads the registry)."""
        log.warning(
            "bookie %s is %s%s",
            self._owner(),
            "writable" if writable else "read-only",
            "" if writable else f" ({'; '.join(self._write_state.reasons)})",
        )
        if self._running() and self._registry is not None:
            self._registry.publish_soon()

    async def close(self, clean: bool) -> None:
        """Leave the registry (``Registry.close``)."""
        registry, self._registry = self._registry, None
        if registry is not None:
            await registry.close(clean)


__all__ = ["REREGISTER_INTERVAL", "Membership", "Registry"]
