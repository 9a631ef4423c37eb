"""The bookie: boot (load index, replay journal), serve, checkpoint, stop or crash.

Boot order matters: nothing is served until the journal after the last checkpoint has been
replayed into ledger storage, so a fence or an add acknowledged before a crash is in force
before the first request of the new life is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
from collections.abc import Callable
from typing import NamedTuple

from aiobk.bookie.advertised import advertised_host
from aiobk.bookie.boot import Repairer, fence_and_limbo, load_repairer, repair
from aiobk.bookie.config import BookieConfig, ConfigError
from aiobk.bookie.connection import ServerConnection
from aiobk.bookie.cookies import check_cookies, clear_marker, marker_present, set_marker
from aiobk.bookie.disk import Disk, OsDisk
from aiobk.bookie.disk_monitor import DiskMonitor
from aiobk.bookie.flow import FlowControl
from aiobk.bookie.gc import GcResult, collect
from aiobk.bookie.journal import Journal
from aiobk.bookie.journal_format import (
    ADD_PREFIX,
    LEDGER_PREFIX,
    LEDGER_VALUE,
    JournalCorruptError,
    Record,
    RecordType,
)
from aiobk.bookie.journal_policy import GroupCommitPolicy
from aiobk.bookie.ledger import MAX_KEY_SIZE
from aiobk.bookie.net import AsyncioNetwork, ServerHandle, ServerNetwork
from aiobk.bookie.ops import HANDLERS, Handler
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.bookie.write_state import DISK, WriteState
from aiobk.metadata import (
    READ_ONLY,
    WRITABLE,
    BookieServiceInfo,
    MetadataStore,
    Registration,
    open_store,
)
from aiobk.protocol import MAX_ENTRY_ID, MalformedEntryError, OpCode, peek_header
from aiobk.protocol.errors import BKError, MetadataStoreError

try:
    SOFTWARE_VERSION = importlib.metadata.version("aiobk")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
    SOFTWARE_VERSION = "unknown"
REREGISTER_INTERVAL = 1.0  # seconds between attempts to register again after losing the lease
CHECKPOINT_RETRY = 1.0  # seconds before trying again after a failed checkpoint

log = logging.getLogger(__name__)


class BookieAddress(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class BookieStateError(RuntimeError):
    """start/stop called in the wrong state."""


class Bookie:
    def __init__(
        self,
        config: BookieConfig,
        *,
        disk: Disk | None = None,
        network: ServerNetwork | None = None,
        metadata: MetadataStore | None = None,
        repairer: Callable[[MetadataStore, str], Repairer] = load_repairer,
        instance_ids: Callable[[], str] | None = None,
    ) -> None:
        """``disk``, ``network`` and ``metadata`` are the I/O seams (DESIGN "the I/O seam");
        ``repairer`` builds the client-side helper of BP-46 phase two; ``instance_ids`` makes
        the id a fresh cookie records (random bytes by default; a simulator passes a seeded
        source so that one seed replays exactly)."""
        self.config = config
        self._make_repairer = repairer
        self._instance_ids = instance_ids or (lambda: os.urandom(16).hex())
        self.stats = BookieStats()
        self.handlers: dict[OpCode, Handler] = HANDLERS
        self.flow = FlowControl(config, self.stats)
        self._disk: Disk = disk or OsDisk()
        self._owns_disk = disk is None
        self._network: ServerNetwork = network or AsyncioNetwork()
        self._server: ServerHandle | None = None
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._checkpoint_lock = asyncio.Lock()
        self._port = config.port
        self._advertised_host = config.host
        self._running = False
        self.write_state = WriteState()
        self.write_state.on_change(self._state_changed)
        self.storage = LedgerStorage(self._disk, config, self.stats, self._write_error)
        self.journal = Journal(
            self._disk,
            config.journal_path,
            GroupCommitPolicy(
                config.journal_max_group_wait,
                config.journal_buffered_writes_threshold,
                config.journal_flush_when_queue_empty,
            ),
            max_file_size=config.journal_max_file_size,
            sync_data=config.journal_sync_data,
            stats=self.stats,
            alignment=config.journal_alignment,
            volatile_sync_delay=config.journal_volatile_sync_delay,
        )
        self.disk_monitor = DiskMonitor(
            config, self._disk, self.write_state, self.journal, self.stats, self._forced_gc
        )
        self._published_state = WRITABLE
        self._publish_task: asyncio.Task[None] | None = None
        self.replayed = 0
        self.checkpoint_error: str | None = None  # why the last checkpoint failed, until one works
        self.instance_id = ""
        self.unclean_start = False
        self._replaced_instances: tuple[str, ...] = ()
        self.limbo_ledgers: list[int] = []
        self._to_repair: list[int] = []
        self._repair_task: asyncio.Task[None] | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self._gc_lock = asyncio.Lock()
        self._metadata = metadata
        self._owns_metadata = False
        self.registration: Registration | None = None
        self._reregister_task: asyncio.Task[None] | None = None
        self._published_free = 0

    # ------------------------------------------------------------------ identity

    @property
    def address(self) -> BookieAddress:
        return BookieAddress(self.config.host, self._port)

    @property
    def bookie_id(self) -> str:
        return self.config.bookie_id or self.advertised_address

    @property
    def advertised_address(self) -> str:
        """The address published for clients (the rule: ``bookie.advertised``)."""
        return self.config.advertised_address or f"{self._advertised_host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._running

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._running:
            raise BookieStateError("bookie is already running")
        if (
            not self.config.journal_write_data
            and not self.config.metadata_uri
            and (self._metadata is None)
        ):
            # Journal-less adds are only safe with BP-46's boot-time fencing, which needs the
            # metadata store to know which ledgers this bookie holds.
            raise ConfigError("journal_write_data = false needs a metadata store (BP-46)")
        self._advertised_host = advertised_host(self.config)  # before the cookie records the id
        for path in (self.config.data_dir, self.config.journal_path, self.config.ledgers_path):
            await self._disk.makedirs(path)
        # Bind (without accepting) first: the cookie records the address actually bound.
        self._server = await self._network.start_server(
            lambda: ServerConnection(self), self.config.host, self.config.port
        )
        self._port = self._server.port
        try:
            await self._boot()
            await self._server.start_serving()
            await self._register()
        except BaseException:
            await self._close_server(abort=True)
            await self.disk_monitor.stop()
            await self.journal.crash()
            await self.storage.close()
            if self._owns_metadata and self._metadata is not None:
                await self._metadata.close()
                self._metadata = None
            raise
        self._running = True
        self.flow.start()
        self.disk_monitor.run()
        self._checkpoint_task = asyncio.get_running_loop().create_task(
            self._checkpoint_loop(), name="bookie-checkpoint"
        )
        if self._to_repair and self._metadata is not None and self.config.boot_repair:
            self._repair_task = asyncio.get_running_loop().create_task(
                self._repair(self._metadata, list(self._to_repair)), name="bookie-repair"
            )
        if self.config.gc_interval > 0 and self._metadata is not None:
            self._gc_task = asyncio.get_running_loop().create_task(
                self._gc_loop(), name="bookie-gc"
            )
        log.info("bookie %s serving on %s", self.bookie_id, self.address)

    async def _boot(self) -> None:
        """BP-46 "The Full Boot-Up Sequence", up to phase one; nothing is served before it ends.

        1. Cookies and the unclean-shutdown marker.
        2. Ledger storage and the journal after the last checkpoint.
        3. Phase one, after a cookie failure that was fixed, or after an unclean shutdown of a
           journal-less bookie (one with a journal lost nothing it acknowledged): every
           non-closed ledger whose ensembles hold this bookie is fenced and put in limbo.
        """
        # Before anything is written: on a full disk the reserve is given back first, and the
        # bookie boots read-only (bookie.disk_monitor).
        await self.disk_monitor.start()
        if self._metadata is None and self.config.metadata_uri:
            self._metadata = open_store(self.config.metadata_uri)
            self._owns_metadata = True
        check = await check_cookies(
            self._disk,
            self.config,
            self._metadata,
            self.bookie_id,
            str(self.address),
            self._instance_ids(),
        )
        self.instance_id = check.cookie.instance_id
        self._replaced_instances = check.replaced_instances
        if check.fixed:
            log.warning("bookie %s: cookies fixed (%s)", self.bookie_id, "; ".join(check.problems))
        self.unclean_start = await marker_present(self._disk, self.config)
        await set_marker(self._disk, self.config)
        mark = await self.storage.open()
        for state in self.storage.ledgers.values():
            # Checkpointed entries are synced; rebuild the cursor from the LAC upward.
            state.sync.confirmed(state.lac)
            entry = state.lac + 1
            while state.location(entry) >= 0:
                state.sync.synced(entry)
                entry += 1
        self.replayed = await self.journal.replay(mark, self._apply)
        await self.journal.start(mark + 1)
        if self.replayed:
            log.info("replayed %d journal records after LSN %d", self.replayed, mark)
            # On a full disk this fails; the journal still holds what it replayed, and the
            # bookie starts anyway (read-only, see bookie.disk_monitor) and retries.
            with contextlib.suppress(Exception):
                await self.checkpoint()
        lost_data = check.fixed or (self.unclean_start and not self.config.journal_write_data)
        if lost_data and self._metadata is not None:
            self.limbo_ledgers, self._to_repair = await fence_and_limbo(self, self._metadata)

    async def stop(self) -> None:
        """Clean stop: no new requests, journal drained, a final checkpoint."""
        if not self._running:
            return
        self._running = False
        await self._deregister(clean=True)
        await self._close_server(abort=False)
        await self._cancel_checkpoints()
        await self.journal.stop()
        try:
            await self.checkpoint(release=False)
            complete = True
        except Exception:
            # With a journal nothing is lost: the next start replays it. Without one, adds
            # that never reached an entry log are gone, and the marker must make the next
            # start take the data-loss path (BP-46).
            complete = self.config.journal_write_data
        await self.storage.close()
        if complete:
            await clear_marker(self._disk, self.config)  # only a clean stop clears it
        if self._owns_disk:
            await self._disk.close()
        log.info("bookie %s stopped", self.bookie_id)

    async def crash(self) -> None:
        """Test hook: stop as a killed process would, without flushing or checkpointing."""
        if not self._running:
            return
        self._running = False
        await self._deregister(clean=False)
        await self._close_server(abort=True)
        await self._cancel_checkpoints()
        await self.journal.crash()
        await self.storage.close()
        if self._owns_disk:
            await self._disk.close()

    @property
    def connections(self) -> list[ServerConnection]:
        return list(self.flow.connections)

    async def _close_server(self, abort: bool) -> None:
        self.flow.stop()
        if self._server is not None:
            self._server.close()
        for conn in self.connections:
            conn.abort() if abort else conn.close()
            for task in list(conn.tasks):
                task.cancel()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._server.wait_closed()
            self._server = None

    async def _repair(self, store: MetadataStore, ledgers: list[int]) -> None:
        """BP-46 phase two, in the background once the bookie serves."""
        repairer = self._make_repairer(store, self.bookie_id)
        try:
            await repair(self, store, repairer, ledgers, self.config.repair_retry_interval)
        finally:
            await repairer.close()

    @property
    def repairing(self) -> bool:
        """The boot-time repair (BP-46 phase two) is still running."""
        return self._repair_task is not None and not self._repair_task.done()

    async def wait_repaired(self) -> None:
        """For tests and operators: until the boot-time repair (if any) has finished."""
        if self._repair_task is not None:
            await asyncio.shield(self._repair_task)

    async def _cancel_checkpoints(self) -> None:
        await self.disk_monitor.stop()
        for name in ("_repair_task", "_gc_task", "_publish_task"):
            background: asyncio.Task[None] | None = getattr(self, name)
            setattr(self, name, None)
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        task, self._checkpoint_task = self._checkpoint_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ registration

    async def _service_info(self) -> BookieServiceInfo:
        free, total = await self.disk_usage()
        self._published_free = free
        self._published_state = WRITABLE if self.write_state.writable else READ_ONLY
        return BookieServiceInfo(
            self.bookie_id,
            self.advertised_address,
            self._published_state,
            SOFTWARE_VERSION,
            free,
            total,
            self.instance_id,
        )

    async def _register(self) -> None:
        """Publish this bookie under a lease (API.md: registers on start)."""
        if self._metadata is None:
            return
        registration = await self._metadata.register_bookie(
            await self._service_info(), self.config.registration_ttl, self._replaced_instances
        )
        registration.on_lost(self._on_registration_lost)
        self.registration = registration

    def _on_registration_lost(self, lost: Registration) -> None:
        if self._running and self._reregister_task is None:
            self._reregister_task = asyncio.get_running_loop().create_task(self._reregister())

    async def _reregister(self) -> None:
        """Keep trying to register again; clients cannot pick this bookie meanwhile."""
        try:
            while self._running:
                try:
                    await self._register()
                    log.info("bookie %s registered again", self.bookie_id)
                    return
                except (MetadataStoreError, BKError) as exc:
                    log.warning("bookie %s: cannot register yet: %s", self.bookie_id, exc)
                await asyncio.sleep(REREGISTER_INTERVAL)
        finally:
            self._reregister_task = None

    async def _refresh_registration(self) -> None:
        """Publish free disk again when it moved by more than 64 MiB, and a change between
        writable and read-only that could not be published when it happened."""
        registration = self.registration
        if registration is None or registration.lost.is_set():
            return
        free, _total = await self.disk_usage()
        state = WRITABLE if self.write_state.writable else READ_ONLY
        if abs(free - self._published_free) >= 64 * 1024 * 1024 or state != self._published_state:
            await registration.update(await self._service_info())

    def _state_changed(self, writable: bool) -> None:
        """Writable or read-only: registered as such at once (placement reads the registry)."""
        log.warning(
            "bookie %s is %s%s",
            self.bookie_id,
            "writable" if writable else "read-only",
            "" if writable else f" ({'; '.join(self.write_state.reasons)})",
        )
        if self._running and (self._publish_task is None or self._publish_task.done()):
            self._publish_task = asyncio.get_running_loop().create_task(
                self._publish_state(), name="bookie-publish-state"
            )

    async def _publish_state(self) -> None:
        try:
            await self._refresh_registration()
        except Exception as exc:  # the next round tries again; the loop must not die of it
            log.warning("bookie %s: cannot publish its state yet: %s", self.bookie_id, exc)

    def _write_error(self, exc: OSError) -> None:
        self.disk_monitor.report(exc)

    async def _forced_gc(self) -> GcResult | None:
        """The disk monitor's forced pass (needs the metadata store, as every pass)."""
        if self._metadata is None or not self._running:
            return None
        return await self.collect_garbage(forced=True)

    async def _deregister(self, clean: bool) -> None:
        task, self._reregister_task = self._reregister_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        registration, self.registration = self.registration, None
        if registration is not None:
            await (registration.close() if clean else registration.abandon())
        if self._owns_metadata and self._metadata is not None:
            await self._metadata.close()
            self._metadata = None

    # ------------------------------------------------------------------ checkpoints

    async def _checkpoint_loop(self) -> None:
        while True:
            delay = self.config.flush_interval
            if self.checkpoint_error is not None:
                delay = min(delay, CHECKPOINT_RETRY)
            await asyncio.sleep(delay)
            with contextlib.suppress(Exception):  # counted and logged by checkpoint()
                await self.checkpoint()
            await self._publish_state()

    async def checkpoint(self, release: bool = True) -> None:
        """Make everything journaled so far durable in ledger storage; trim the journal.

        A failure is logged, counted (``checkpoint_failures``) and kept in
        ``checkpoint_error`` until a checkpoint succeeds; the journal keeps every record the
        failed one did not cover, and the checkpoint loop tries again soon."""
        async with self._checkpoint_lock:
            mark = self.journal.last_lsn
            try:
                await self.storage.checkpoint(mark)
            except Exception as exc:
                if isinstance(exc, OSError):
                    self.disk_monitor.report(exc)
                self.stats.checkpoint_failures += 1
                kind = type(exc)
                name = kind.__qualname__
                if kind.__module__ != "builtins":
                    name = f"{kind.__module__}.{name}"
                self.checkpoint_error = f"{name}: {exc}"
                log.error(
                    "bookie %s: checkpoint failed (%d so far); the journal is kept until one "
                    "succeeds: %s",
                    self.bookie_id,
                    self.stats.checkpoint_failures,
                    self.checkpoint_error,
                    exc_info=not isinstance(exc, OSError),
                )
                raise
            if self.checkpoint_error is not None:
                log.warning("bookie %s: checkpoints succeed again", self.bookie_id)
                self.checkpoint_error = None
            if release:
                await self.journal.release(mark)

    # ------------------------------------------------------------------ garbage collection

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gc_interval)
            try:
                result = await self.collect_garbage()
            except OSError:
                log.exception("garbage collection failed; trying again next time")
                continue
            if result.skipped:
                log.warning("bookie %s: gc pass skipped: %s", self.bookie_id, result.skipped)

    async def collect_garbage(self, forced: bool = False) -> GcResult:
        """One pass reclaiming deleted ledgers' disk (``bookie.gc``); needs the metadata store.
        ``forced``: the disk is over its warning threshold (``bookie.disk_monitor``)."""
        if self._metadata is None:
            raise ConfigError("garbage collection needs a metadata store")
        if not self._running:
            raise BookieStateError("the bookie is not running")
        short = forced or self.write_state.is_set(DISK)
        async with self._gc_lock:
            return await collect(self, self._metadata, short_of_space=short)

    # ------------------------------------------------------------------ replay

    def _apply(self, record: Record) -> None:
        """Re-apply one journal record to ledger storage during boot.

        Every record here was acknowledged or at least journaled, so none may stop the boot:
        a value storage cannot hold (written by a version that did not check requests at the
        door, ``protocol.limits``) is logged, counted and left out rather than refused."""
        payload = record.payload
        storage = self.storage
        ledgers = storage.ledgers
        if record.kind is RecordType.MASTER_KEY:
            (ledger_id,) = LEDGER_PREFIX.unpack_from(payload)
            key = payload[LEDGER_PREFIX.size :]
            if len(key) > MAX_KEY_SIZE:
                self._skip(record, f"ledger {ledger_id}: a {len(key)}-byte master key")
                key = b""  # kept as a ledger whose key is unknown, like a limbo one
            state = ledgers.get(ledger_id)
            if state is None:
                if ledger_id not in storage.deleted:
                    storage.create(ledger_id, key)
            elif not state.master_key:
                state.master_key = key  # limbo ledger created at boot learns its key
            return
        ledger_id = LEDGER_PREFIX.unpack_from(payload)[0]
        state = ledgers.get(ledger_id)
        if state is None:
            if ledger_id in storage.deleted:
                return  # garbage collected after this record was written
            raise JournalCorruptError(
                f"journal record {record.lsn} names ledger {ledger_id} before its master key"
            )
        if record.kind is RecordType.ADD:
            _ledger, entry_id = ADD_PREFIX.unpack_from(payload)
            body = payload[ADD_PREFIX.size :]
            try:
                lac = peek_header(body)[2]
            except MalformedEntryError as exc:
                self._skip(record, f"entry {ledger_id}/{entry_id}: {exc}")
                return
            if not 0 <= entry_id <= MAX_ENTRY_ID:
                self._skip(record, f"entry id {entry_id} of ledger {ledger_id}")
                return
            storage.add_entry(state, entry_id, body)
            state.advance_lac(lac)
            state.sync.synced(entry_id)  # replayed: made durable by the checkpoint after boot
        elif record.kind is RecordType.FENCE:
            state.fenced = True
            state.meta_dirty = True
        elif record.kind is RecordType.EXPLICIT_LAC:
            state.advance_lac(LEDGER_VALUE.unpack_from(payload)[1])
        elif record.kind is RecordType.LIMBO:
            state.limbo = bool(LEDGER_VALUE.unpack_from(payload)[1])
            state.meta_dirty = True

    def _skip(self, record: Record, what: str) -> None:
        self.stats.journal_records_skipped += 1
        log.error(
            "bookie %s: journal record %d holds %s that ledger storage cannot keep; left out",
            self.bookie_id,
            record.lsn,
            what,
        )

    # ------------------------------------------------------------------ helpers

    def gauges(self) -> dict[str, int]:
        """Figures of the moment, beside the counters (GET_BOOKIE_INFO, metrics)."""
        flow = self.flow
        return {
            "writable": int(self.write_state.writable),
            "high_priority_writes": int(self.write_state.high_priority),
            "checkpoint_failing": int(self.checkpoint_error is not None),
            "journal_failed": int(self.journal.failed is not None),
            "connections_open": len(flow.connections),
            "connection_bytes_held": flow.held,
            "add_bytes_in_progress": flow.add_bytes,
            "long_polls_waiting": flow.long_polls,
            "ledgers_held": len(self.storage.ledgers),
        }

    async def disk_usage(self) -> tuple[int, int]:
        return await self._disk.usage(self.config.data_dir)

    def log_corruption(self, exc: Exception) -> None:
        log.error("bookie %s: cannot serve an entry: %s", self.bookie_id, exc)
