"""The metadata store: ledgers, ids, bookie registry, cookies and logs, over one ``KV``.

Every update is a compare-and-set on the version the caller read (the key's mod revision); a
lost race raises ``MetadataVersionError`` and the caller re-reads (``update_ledger`` runs that
loop with a retry budget). The client and the bookie use only this class: neither touches etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection

from aiobk.metadata.autorecovery import AutoRecoveryStore
from aiobk.metadata.keys import KeyLayout
from aiobk.metadata.kv import (
    KV,
    KeyExistsError,
    KeyMissingError,
    KeyValue,
    RevisionMismatchError,
    Watch,
    WatchCompactedError,
)
from aiobk.metadata.listing import walk_ids
from aiobk.metadata.model import LedgerMetadata, MetadataFormatError
from aiobk.metadata.records import BookieServiceInfo, ClusterRecord, Cookie, LogMetadata
from aiobk.metadata.registration import Registration
from aiobk.protocol.errors import (
    BookieAlreadyRegisteredError,
    LedgerExistsError,
    LogExistsError,
    MetadataVersionError,
    NoSuchClusterError,
    NoSuchLedgerError,
    NoSuchLogError,
)

DEFAULT_BOOKIE_TTL = 10.0  # seconds; a dead bookie disappears this long after its last refresh


class MetadataStore:
    def __init__(self, kv: KV, prefix: str = "aiobk", uri: str = "") -> None:
        self.kv = kv
        self.keys = KeyLayout(prefix)
        self.uri = uri or kv.description
        self.autorecovery = AutoRecoveryStore(kv, self.keys)
        self._watches: dict[Watch, None] = {}  # ordered: notified as opened

    async def close(self) -> None:
        for watch in list(self._watches):
            await watch.close()
        await self.kv.close()

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ history

    async def compact_history(self, keep: int) -> int:
        """Let the store forget all but the last ``keep`` revisions of history (etcd keeps
        every revision until compacted, and refuses all writes once its database reaches its
        quota). Watches start from a revision just read, so they need little history; one
        that falls ``keep`` revisions behind fails and its owner reads again. Returns the
        revision compacted to (0: nothing to do yet). Every bookie calls this after its GC
        pass: compacting to an older revision than another did is a no-op."""
        _found, revision = await self.kv.get(self.keys.idgen)
        target = revision - keep
        if keep <= 0 or target <= 0:
            return 0
        await self.kv.compact(target)
        return target

    # ------------------------------------------------------------------ the cluster

    async def read_cluster(self) -> ClusterRecord | None:
        """The cluster record (None: the prefix has none)."""
        found, _revision = await self.kv.get(self.keys.cluster)
        if found is None:
            return None
        return ClusterRecord.from_json(found.value, found.mod_revision)

    async def set_up_cluster(self, instance_id: str) -> ClusterRecord:
        """The cluster record, written now with ``instance_id`` when the prefix has none: by
        the first bookie that boots under the prefix, or by the first to boot with this version
        in a cluster set up before the record existed. An existing record never changes."""
        found = await self.read_cluster()
        if found is not None:
            return found
        record = ClusterRecord(instance_id)
        try:
            version = await self.kv.create(self.keys.cluster, record.to_json())
        except KeyExistsError:  # another bookie set the cluster up meanwhile: its record holds
            found = await self.read_cluster()
            if found is None:
                raise MetadataVersionError(
                    "the cluster record vanished as it was written"
                ) from None
            return found
        return dataclasses.replace(record, version=version)

    async def check_cluster(self) -> ClusterRecord | None:
        """The cluster record; None for a cluster set up before the record existed, known by
        the keys its bookies, clients and autorecovery wrote (cookies, registrations, ledgers,
        logs, autorecovery's keys, the id counter); ``NoSuchClusterError`` when the prefix
        holds no cluster at all."""
        found = await self.read_cluster()
        if found is not None:
            return found
        keys = self.keys
        for prefix in (keys.cookies, keys.bookies, keys.ledgers, keys.logs, keys.autorecovery):
            page, _revision = await self.kv.range(prefix, None, 1, keys_only=True)
            if page:
                return None
        counter, _revision = await self.kv.get(keys.idgen)
        if counter is not None:
            return None
        where = "" if self.uri.startswith("memory://") else f" under prefix {keys.root.decode()}"
        raise NoSuchClusterError(
            f"{self.uri}: no aiobk cluster was ever set up{where} (no bookie has started with "
            "this metadata URI); check it"
        )

    # ------------------------------------------------------------------ ledgers

    async def allocate_ledger_id(self) -> int:
        """A ledger id no other client will get (the revision of one write to the counter)."""
        return await self.kv.bump(self.keys.idgen)

    async def create_ledger(self, ledger_id: int, metadata: LedgerMetadata) -> LedgerMetadata:
        """Store a new ledger; LedgerExistsError if the id is taken."""
        try:
            version = await self.kv.create(self.keys.ledger(ledger_id), metadata.to_json())
        except KeyExistsError:
            raise LedgerExistsError(f"ledger {ledger_id} already exists") from None
        return metadata.with_version(version)

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        found, _revision = await self.kv.get(self.keys.ledger(ledger_id))
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.from_json(found.value, found.mod_revision)

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata) -> LedgerMetadata:
        """Replace the ledger's metadata if it is still at ``metadata.version``."""
        key = self.keys.ledger(ledger_id)
        try:
            version = await self.kv.compare_and_set(key, metadata.to_json(), metadata.version)
        except KeyMissingError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        except RevisionMismatchError as exc:
            raise MetadataVersionError(
                f"ledger {ledger_id} changed: at version {exc.actual}, not {metadata.version}"
            ) from None
        return metadata.with_version(version)

    async def update_ledger(
        self,
        ledger_id: int,
        change: Callable[[LedgerMetadata], LedgerMetadata | None],
        retries: int = 20,
    ) -> LedgerMetadata:
        """Read-modify-write until it lands. ``change`` returns None to leave it as it is."""
        for _attempt in range(retries):
            current = await self.read_ledger(ledger_id)
            wanted = change(current)
            if wanted is None:
                return current
            try:
                return await self.write_ledger(ledger_id, wanted.with_version(current.version))
            except MetadataVersionError:
                await asyncio.sleep(0)
        raise MetadataVersionError(f"ledger {ledger_id}: still racing after {retries} attempts")

    async def delete_ledger(self, ledger_id: int, version: int | None = None) -> None:
        try:
            await self.kv.delete(self.keys.ledger(ledger_id), version)
        except KeyMissingError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        except RevisionMismatchError as exc:
            raise MetadataVersionError(
                f"ledger {ledger_id} changed: at version {exc.actual}, not {version}"
            ) from None

    async def list_ledgers(self, page_size: int = 1000) -> AsyncIterator[int]:
        """Every ledger id in ascending order, fetched a page at a time (keys only), through
        windows of ids (``metadata.listing``: etcd counts a limited range to its end)."""
        keys = self.keys
        async for item in walk_ids(self.kv, keys.ledgers, keys.ledger, page_size, keys_only=True):
            yield keys.ledger_id(item.key)

    async def scan_ledgers(
        self, page_size: int = 500
    ) -> AsyncIterator[tuple[int, LedgerMetadata | None]]:
        """Every ledger with its metadata, ascending, a page at a time (the auditor's walk);
        None for metadata this version cannot read (the walk goes on past it)."""
        keys = self.keys
        async for item in walk_ids(self.kv, keys.ledgers, keys.ledger, page_size, keys_only=False):
            try:
                metadata: LedgerMetadata | None = LedgerMetadata.from_json(
                    item.value, item.mod_revision
                )
            except MetadataFormatError:
                metadata = None
            yield keys.ledger_id(item.key), metadata

    async def watch_ledger(self, ledger_id: int) -> AsyncIterator[LedgerMetadata | None]:
        """The ledger's metadata now, then after every change (None once deleted)."""
        async with contextlib.aclosing(self._follow(self.keys.ledger(ledger_id))) as states:
            async for found in states:
                yield (
                    None
                    if found is None
                    else LedgerMetadata.from_json(found.value, found.mod_revision)
                )

    async def _follow(self, key: bytes) -> AsyncGenerator[KeyValue | None, None]:
        """The key now (None: absent), then after every change.

        A watch that falls behind the store's compaction (its stream broke, and the changes it
        missed were compacted meanwhile: ``WatchCompactedError``) cannot resume where it was:
        the key is read again, yielded if it is not the state last yielded, and watched on
        from that read. The owner may then miss states in between, never the latest one."""
        found, revision = await self.kv.get(key)
        last: int | None = -1  # mod revision of the state last yielded (None: absent)
        while True:
            watch = await self.kv.watch(key, prefix=False, start_revision=revision + 1)
            self._watches[watch] = None
            try:
                now = found.mod_revision if found is not None else None
                if now != last:
                    last = now
                    yield found
                async for event in watch:
                    found = (
                        None
                        if event.value is None
                        else KeyValue(event.key, event.value, event.revision)
                    )
                    last = event.revision if found is not None else None
                    yield found
                return  # closed with the store
            except WatchCompactedError:
                pass
            finally:
                self._watches.pop(watch, None)
                await watch.close()
            found, revision = await self.kv.get(key)

    # ------------------------------------------------------------------ bookies

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
        after: bytes | None = None
        while True:
            page, _revision = await self.kv.range(self.keys.bookies, after, 1000)
            for item in page:
                info = BookieServiceInfo.from_json(item.value, item.mod_revision)
                if info.writable or not writable_only:
                    out.append(info)
            if len(page) < 1000:
                return out
            after = page[-1].key

    async def bookie_leases(self) -> dict[str, tuple[float, float]]:
        """Each registered bookie's id -> (seconds since it last refreshed its registration's
        lease, the lease's TTL). A live bookie refreshes every third of its TTL; a dead one's
        registration stays until the TTL runs out, so this is the registry's word on when a
        bookie was last heard from. A bookie whose lease the store cannot describe is left
        out (``KV.lease_time_to_live``)."""
        leases: dict[str, int] = {}
        after: bytes | None = None
        while True:
            page, _revision = await self.kv.range(self.keys.bookies, after, 1000)
            for item in page:
                if item.lease:
                    leases[item.key[len(self.keys.bookies) :].decode()] = item.lease
            if len(page) < 1000:
                break
            after = page[-1].key
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
        after: bytes | None = None
        while True:
            page, _revision = await self.kv.range(self.keys.cookies, after, 1000)
            out.extend(Cookie.from_json(item.value, item.mod_revision) for item in page)
            if len(page) < 1000:
                return out
            after = page[-1].key

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

    # ------------------------------------------------------------------ logs

    async def create_log(self, name: str, record_format: str = "raw") -> LogMetadata:
        record = LogMetadata(name, record_format=record_format)
        try:
            version = await self.kv.create(self.keys.log(name), record.to_json())
        except KeyExistsError:
            raise LogExistsError(f"log {name!r} already exists") from None
        return dataclasses.replace(record, version=version)

    async def read_log(self, name: str) -> LogMetadata:
        found, _revision = await self.kv.get(self.keys.log(name))
        if found is None:
            raise NoSuchLogError(f"log {name!r} does not exist")
        return LogMetadata.from_json(found.value, found.mod_revision)

    async def write_log(self, record: LogMetadata) -> LogMetadata:
        """Replace the log's ledger list if it is still at ``record.version``."""
        try:
            version = await self.kv.compare_and_set(
                self.keys.log(record.name), record.to_json(), record.version
            )
        except KeyMissingError:
            raise NoSuchLogError(f"log {record.name!r} does not exist") from None
        except RevisionMismatchError as exc:
            raise MetadataVersionError(
                f"log {record.name!r} changed: at version {exc.actual}, not {record.version}"
            ) from None
        return dataclasses.replace(record, version=version)

    async def delete_log(self, name: str, version: int | None = None) -> None:
        try:
            await self.kv.delete(self.keys.log(name), version)
        except KeyMissingError:
            raise NoSuchLogError(f"log {name!r} does not exist") from None
        except RevisionMismatchError as exc:
            raise MetadataVersionError(f"log {name!r} changed: {exc}") from None

    async def list_logs(self, page_size: int = 1000) -> AsyncIterator[str]:
        after: bytes | None = None
        while True:
            page, _revision = await self.kv.range(self.keys.logs, after, page_size)
            for item in page:
                yield self.keys.log_name(item.key)
            if len(page) < page_size:
                return
            after = page[-1].key

    async def watch_log(self, name: str) -> AsyncIterator[LogMetadata | None]:
        """The log record now, then after every change (None once deleted)."""
        async with contextlib.aclosing(self._follow(self.keys.log(name))) as states:
            async for found in states:
                yield (
                    None
                    if found is None
                    else LogMetadata.from_json(found.value, found.mod_revision)
                )
