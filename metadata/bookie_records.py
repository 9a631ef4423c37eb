"""Bookies' records in the metadata store: the registry (one key per live bookie, under its
lease, so a dead bookie's entry goes when the lease runs out) and the cookies (one per bookie
that ever booted against the store, kept until it is decommissioned)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection

from aiobk.metadata.key_space import KeySpace
from aiobk.metadata.kv import (
    KeyExistsError,
    KeyMissingError,
    RevisionMismatchError,
    WatchCompactedError,
)
from aiobk.metadata.records import BookieServiceInfo, Cookie
from aiobk.metadata.registration import Registration
from aiobk.protocol.errors import BookieAlreadyRegisteredError, MetadataVersionError

DEFAULT_BOOKIE_TTL = 10.0  # seconds; a dead bookie disappears this long after its last refresh


class BookieRecords(KeySpace):
    """The registry and the cookies (part of ``MetadataStore``)."""

    async def register_bookie(
        self,
        info: BookieServiceInfo,
        ttl: float = DEFAULT_BOOKIE_TTL,
        replaces: Collection[str] = (),
    ) -> Registration:
        """Publish a live bookie under a lease; fails if a live process holds the same id.

        ``replaces``: older instance ids of this bookie (its cookies were just fixed) whose
        leftover registration it may take over."""
        key = self.keys.bookie(info.bookie_id)
        lease, granted = await self.kv.grant_lease(ttl)
        try:
            try:
                await self.kv.create(key, info.to_json(), lease)
            except KeyExistsError:
                await self._take_over(key, info, lease, ttl, replaces)
        except BaseException:
            await self.kv.revoke_lease(lease)
            raise
        return Registration(self.kv, key, info, lease, granted)

    async def _take_over(
        self,
        key: bytes,
        info: BookieServiceInfo,
        lease: int,
        ttl: float,
        replaces: Collection[str],
    ) -> None:
        """The id is registered. If it is this bookie's own previous life (same instance id:
        the same data directories, e.g. restarted after a crash before its lease ran out), the
        registration moves to the new lease; anything else is a live impostor and refused."""
        current, _revision = await self.kv.get(key)
        if current is not None:
            holder = BookieServiceInfo.from_json(current.value, current.mod_revision)
            mine = {info.instance_id, *replaces} - {""}
            if holder.instance_id in mine:
                try:
                    await self.kv.compare_and_set(key, info.to_json(), current.mod_revision, lease)
                except (KeyMissingError, RevisionMismatchError):
                    pass  # it changed under us: fall through to a plain create attempt
                else:
                    if current.lease and current.lease != lease:
                        await self.kv.revoke_lease(current.lease)
                    return
        try:
            await self.kv.create(key, info.to_json(), lease)
        except KeyExistsError:
            raise BookieAlreadyRegisteredError(
                f"bookie {info.bookie_id} is already registered by another live process; "
                f"stop it first, or wait up to {ttl:g}s for its lease to expire"
            ) from None

    async def list_bookies(self, writable_only: bool = False) -> list[BookieServiceInfo]:
        out: list[BookieServiceInfo] = []
        async for page in self._pages(self.keys.bookies):
            for item in page:
                info = BookieServiceInfo.from_json(item.value, item.mod_revision)
                if info.writable or not writable_only:
                    out.append(info)
        return out

    async def bookie_leases(self) -> dict[str, tuple[float, float]]:
        """Each registered bookie's id -> (seconds since it last refreshed its registration's
        lease, the lease's TTL). A live bookie refreshes every third of its TTL; a dead one's
        registration stays until the TTL runs out, so this is the registry's word on when a
        bookie was last heard from. A bookie whose lease the store cannot describe is left
        out (``KV.lease_time_to_live``)."""
        leases: dict[str, int] = {}
        async for page in self._pages(self.keys.bookies):
            for item in page:
                if item.lease:
                    leases[item.key[len(self.keys.bookies) :].decode()] = item.lease
        asked = await asyncio.gather(
            *(self.kv.lease_time_to_live(lease) for lease in leases.values())
        )
        out: dict[str, tuple[float, float]] = {}
        for bookie_id, answer in zip(leases, asked, strict=True):
            if answer is not None and answer[0] > 0:
                remaining, granted = answer
                out[bookie_id] = (max(0.0, granted - remaining), granted)
        return out

    async def watch_bookies(self) -> AsyncIterator[list[BookieServiceInfo]]:
        """The registered bookies now, then the whole set again after every change (read
        afresh when the watch falls behind the store's compaction)."""
        while True:
            current: dict[bytes, BookieServiceInfo] = {}
            page, revision = await self.kv.range(self.keys.bookies, None, 100_000)
            for item in page:
                current[item.key] = BookieServiceInfo.from_json(item.value, item.mod_revision)
            watch = await self.kv.watch(self.keys.bookies, prefix=True, start_revision=revision + 1)
            self._watches[watch] = None
            try:
                yield sorted(current.values(), key=lambda b: b.bookie_id)
                async for event in watch:
                    if event.value is None:
                        current.pop(event.key, None)
                    else:
                        current[event.key] = BookieServiceInfo.from_json(
                            event.value, event.revision
                        )
                    yield sorted(current.values(), key=lambda b: b.bookie_id)
                return  # closed (the store is closing)
            except WatchCompactedError:
                pass
            finally:
                self._watches.pop(watch, None)
                await watch.close()

    # ------------------------------------------------------------------ cookies

    async def read_cookie(self, bookie_id: str) -> Cookie | None:
        found, _revision = await self.kv.get(self.keys.cookie(bookie_id))
        return None if found is None else Cookie.from_json(found.value, found.mod_revision)

    async def list_cookies(self) -> list[Cookie]:
        """Every cookie: the bookies that ever booted against this store and were not
        decommissioned since, running or not."""
        out: list[Cookie] = []
        async for page in self._pages(self.keys.cookies):
            out.extend(Cookie.from_json(item.value, item.mod_revision) for item in page)
        return out

    async def write_cookie(self, cookie: Cookie) -> Cookie:
        """Create (``cookie.version == -1``) or replace at ``cookie.version``."""
        key = self.keys.cookie(cookie.bookie_id)
        try:
            if cookie.version < 0:
                version = await self.kv.create(key, cookie.to_json())
            else:
                version = await self.kv.compare_and_set(key, cookie.to_json(), cookie.version)
        except (KeyExistsError, KeyMissingError, RevisionMismatchError) as exc:
            raise MetadataVersionError(f"cookie of {cookie.bookie_id} changed: {exc}") from None
        return Cookie(
            cookie.bookie_id,
            cookie.address,
            cookie.journal_dirs,
            cookie.data_dirs,
            cookie.instance_id,
            version,
        )

    async def delete_cookie(self, bookie_id: str, version: int) -> None:
        try:
            await self.kv.delete(self.keys.cookie(bookie_id), version)
        except (KeyMissingError, RevisionMismatchError) as exc:
            raise MetadataVersionError(f"cookie of {bookie_id} changed: {exc}") from None
