"""The bookie: boot (load index, replay journal), serve, checkpoint, stop or crash.

Boot order matters: nothing is served until the journal after the last checkpoint has been
replayed into ledger storage, so a fence or an add acknowledged before a crash is in force
before the first request of the new life is read.

``Bookie`` is the wiring and the lifecycle; the work beside serving belongs to parts that own
their loops and state: ``bookie.background`` (its tasks), ``bookie.checkpoints``,
``bookie.gc`` (``GcSchedule``), ``bookie.registration`` (``Membership``), ``bookie.tls`` (the
reload), ``bookie.secret`` and ``bookie.companions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from aiobk.bookie.access import Policy
from aiobk.bookie.advertised import advertised_host
from aiobk.bookie.background import Background
from aiobk.bookie.boot import BootResult, boot
from aiobk.bookie.checkpoints import CHECKPOINT_RETRY, Checkpoints
from aiobk.bookie.companions import CompanionFactory, Companions
from aiobk.bookie.config import BookieConfig, ConfigError
from aiobk.bookie.connection import ConnectionHooks, ServerConnection
from aiobk.bookie.context import BookieContext
from aiobk.bookie.cookies import clear_marker
from aiobk.bookie.disk import Disk, OsDisk
from aiobk.bookie.disk_monitor import DiskMonitor
from aiobk.bookie.errors import BookieStateError
from aiobk.bookie.flow import FlowControl
from aiobk.bookie.gauges import bookie_gauges
from aiobk.bookie.gc import GarbageCollector, GcResult, GcSchedule
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.journal.policy import GroupCommitPolicy
from aiobk.bookie.key_check import KeyCheck
from aiobk.bookie.ledgers import Ledgers
from aiobk.bookie.net import AsyncioNetwork, BookieAddress, ServerHandle, ServerNetwork
from aiobk.bookie.ops import HANDLERS
from aiobk.bookie.registration import REREGISTER_INTERVAL, Membership
from aiobk.bookie.repair import RepairerFactory, run_repair
from aiobk.bookie.secret import ClusterSecret
from aiobk.bookie.stats import BookieStats, bound_to_loop
from aiobk.bookie.storage import LedgerStorage
from aiobk.bookie.teardown import Teardown
from aiobk.bookie.tls import BookieTls
from aiobk.bookie.write_state import OPERATOR, WriteState
from aiobk.metadata import MetadataStore, Registration, open_store

try:
    SOFTWARE_VERSION = importlib.metadata.version("aiobk")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
    SOFTWARE_VERSION = "unknown"

log = logging.getLogger(__name__)


class Bookie:
    """One bookie: the storage server that journals, stores and serves ledger entries.

    ``await start()`` boots it (cookies, journal replay, BP-46's fencing after an unclean
    stop), serves, and registers it in the metadata store; ``await stop()`` stops it cleanly
    (journal drained, a final checkpoint, deregistered). The ``aiobk bookie start`` command
    builds one with ``aiobk.runner.make_bookie``, which also hands it the client's BP-46
    repairer; a ``Bookie(config)`` built directly has none and leaves ledgers a data loss put
    in limbo there until a client recovers them.

    Attributes:
        config: Its settings.
        stats: Its counters and histograms (what ``--metrics-port`` exports).
        booted: What its last start found and did (``bookie.boot.BootResult``: the id of
            its data, whether the last stop was unclean, the ledgers put in limbo, the
            journal records replayed).
    """

    def __init__(
        self,
        config: BookieConfig,
        *,
        disk: Disk | None = None,
        network: ServerNetwork | None = None,
        metadata: MetadataStore | None = None,
        repairer: RepairerFactory | None = None,
        instance_ids: Callable[[], str] | None = None,
        companions: Sequence[CompanionFactory] = (),
        tls: BookieTls | None = None,
    ) -> None:
        """A bookie of ``config``; nothing happens until ``start()``.

        Args:
            config: Its settings.
            disk: The file-system seam (``OsDisk`` by default; the simulator's loses what
                was not synced).
            network: The listening-socket seam (``AsyncioNetwork`` by default).
            metadata: A metadata store to use instead of opening ``config.metadata_uri``.
            repairer: Builds the client-side helper of BP-46 phase two (the wiring passes
                ``aiobk.client.repair.BookieRepairer``; without it limbo ledgers stay in
                limbo).
            instance_ids: Makes the id a fresh cookie records (random bytes by default; the
                simulator passes a seeded source so that one seed replays exactly).
            companions: Services run beside the bookie while it serves, given its id and
                metadata store (the wiring passes autorecovery's).
            tls: The TLS material, when the wiring shares it with the bookie's own client
                connections (made from the config's ``tls_*`` files otherwise).

        Raises:
            ConfigError: The TLS files are unusable.
        """
        self.config = config
        self._make_repairer = repairer
        self.companions = Companions(companions)  # running while the bookie serves
        self._instance_ids = instance_ids or (lambda: os.urandom(16).hex())
        self.stats = stats = BookieStats()
        # Whose disk usage the exporter reports (BookKeeper's journal and ledger directories).
        stats.directories = tuple(dict.fromkeys((config.journal_path, config.ledgers_path)))
        self.flow = FlowControl(config, stats)
        self._disk: Disk = disk or OsDisk()
        self._owns_disk = disk is None
        self._network: ServerNetwork = network or AsyncioNetwork()
        self._server: ServerHandle | None = None
        self._port = config.port
        self._advertised_host = config.host
        self._running = False
        self.write_state = WriteState()
        self.membership = Membership(
            lambda: self._metadata,
            config.registration_ttl,
            SOFTWARE_VERSION,
            self.disk_usage,
            self.write_state,
            lambda: self.bookie_id,
            lambda: self._running,
            config.rack,
        )
        self.write_state.on_change(self.membership.state_changed)
        self.storage = LedgerStorage(self._disk, config, stats, self._write_error)
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
            stats=stats,
            alignment=config.journal_alignment,
            volatile_sync_delay=config.journal_volatile_sync_delay,
        )
        self.ledgers = Ledgers(
            self.storage, self.journal, stats, journal_adds=config.journal_write_data
        )
        self.gc = GcSchedule(
            GarbageCollector(self.storage, config, stats, self.checkpoint),
            config,
            lambda: self._metadata,
            lambda: self.bookie_id,
            lambda: self._running,
            self.write_state,
            lambda: self.repairing,
        )
        self.disk_monitor = DiskMonitor(
            config, self._disk, self.write_state, self.journal, stats, self.gc.forced
        )
        self.checkpoints = Checkpoints(self.storage, self.journal, stats, self._write_error)
        self.storage.on_cache_full = self.checkpoints.wake
        self.context = BookieContext(
            config,
            stats,
            self.storage,
            self.journal,
            self.ledgers,
            self.flow,
            self.write_state,
            self,
            self.log_corruption,
            KeyCheck(max_waiting_per_peer=config.max_inflight_per_connection),
        )
        journal = self.journal
        if tls is None and config.tls_enabled:
            tls = BookieTls(config)
        self.tls = tls
        policy = Policy(
            guarded=tls is not None, tls_only=config.tls_only, client_auth=config.tls_client_auth
        )
        self._hooks = ConnectionHooks(
            journal.flush_idle, lambda: journal.urgent, tls=tls, policy=policy
        )
        self.background = Background(lambda: self.bookie_id)  # work beside serving
        self.booted = BootResult()  # what the last start found and did
        self._metadata = metadata
        self._owns_metadata = False
        self.secret = ClusterSecret(lambda: self._metadata)  # read once it exists

    # ------------------------------------------------------------------ identity

    @property
    def address(self) -> BookieAddress:
        """Where it listens (the port bound, once started)."""
        return BookieAddress(self.config.host, self._port)

    @property
    def bookie_id(self) -> str:
        """Its identity in ledger metadata: ``bookie_id``, else the advertised address."""
        return self.config.bookie_id or self.advertised_address

    @property
    def advertised_address(self) -> str:
        """The address published for clients (the rule: ``bookie.advertised``)."""
        return self.config.advertised_address or f"{self._advertised_host}:{self._port}"

    @property
    def running(self) -> bool:
        """Whether it is started and not stopped."""
        return self._running

    @property
    def registration(self) -> Registration | None:
        """This bookie's lease in the registry, while it holds one."""
        return self.membership.registration

    @property
    def checkpoint_error(self) -> str | None:
        """Why the last checkpoint failed, until one works (``bookie.checkpoints``)."""
        return self.checkpoints.error

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Boot, serve and register; returns once requests are served.

        Raises:
            BookieStateError: It is running already.
            ConfigError: Journal-less adds without a metadata store, or a bad setting.
            CookieError: Its cookies disagree with the metadata store (BP-46).
            JournalCorruptError: The journal is damaged before its tail.
            IndexCorruptError: The index is damaged.
        """
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
        self.stats.clock = bound_to_loop(self.stats.clock)  # this loop's, read directly
        for path in (self.config.data_dir, self.config.journal_path, self.config.ledgers_path):
            await self._disk.makedirs(path)
        # Bind (without accepting) first: the cookie records the address actually bound.
        context, handlers, hooks = self.context, HANDLERS, self._hooks
        self._server = await self._network.start_server(
            lambda: ServerConnection(context, handlers, hooks), self.config.host, self.config.port
        )
        self._port = self._server.port
        self.ledgers.owner = self.checkpoints.owner = self.bookie_id
        try:
            await self._boot()
            await self._server.start_serving()
            await self.membership.register(
                self.advertised_address, self.booted.instance_id, self.booted.replaced_instances
            )
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
        self.background.spawn(
            "checkpoint", self.checkpoints.run(self.config.flush_interval, self.membership.publish)
        )
        to_repair = self.booted.to_repair
        if to_repair and self._metadata is not None and self.config.boot_repair:
            self.background.spawn(
                "repair",
                run_repair(
                    self._make_repairer,
                    self.ledgers,
                    self._metadata,
                    list(to_repair),
                    self.bookie_id,
                    self.config.repair_retry_interval,
                ),
            )
        if self.config.gc_interval > 0 and self._metadata is not None:
            self.background.spawn("gc", self.gc.run())
        if self.tls is not None and self.config.tls_reload_interval > 0:
            self.background.spawn(
                "tls-reload", self.tls.reload_every(self.config.tls_reload_interval)
            )
        compacting = self.config.gc_interval > 0 and self.config.metadata_history_revisions > 0
        if self._metadata is not None and not compacting:
            log.warning(
                "bookie %s: with gc_interval or metadata_history_revisions 0, nothing here "
                "compacts etcd's history: unless etcd runs with --auto-compaction-retention, its "
                "database grows until its quota stops every write",
                self.bookie_id,
            )
        if self._metadata is not None:
            await self.companions.start(self.bookie_id, self._metadata)
        log.info("bookie %s serving on %s", self.bookie_id, self.address)

    async def _boot(self) -> None:
        """Nothing is served before this ends (``bookie.boot``)."""
        # Before anything is written: on a full disk the reserve is given back first, and the
        # bookie boots read-only (bookie.disk_monitor).
        await self.disk_monitor.start()
        if self._metadata is None and self.config.metadata_uri:
            self._metadata = open_store(self.config.metadata_uri)
            self._owns_metadata = True
        fresh_instance = self._instance_ids()
        if self._metadata is not None:
            # The first bookie to boot under a prefix sets the cluster up. Its id is derived
            # from this boot's fresh instance id: no other draw on the random source.
            digest = hashlib.sha256(b"cluster:" + fresh_instance.encode()).hexdigest()
            await self._metadata.set_up_cluster(digest[:32])
        self.booted = await boot(
            self.context, self._disk, self._metadata, str(self.address), fresh_instance
        )

    @property
    def metadata(self) -> MetadataStore | None:
        """The metadata store the bookie uses while it serves (None: it runs without one)."""
        return self._metadata if self._running else None

    def set_read_only(self, read_only: bool) -> None:
        """An operator's read-only (``aiobk bookie state``, the HTTP API): set, or lifted --
        which lifts only the operator's reason; a full disk or a failed journal still holds."""
        if read_only:
            self.write_state.set(OPERATOR, "set read-only by an operator")
        else:
            self.write_state.clear(OPERATOR)

    async def stop(self) -> None:
        """Clean stop: no new requests, journal drained, a final checkpoint. Every step runs
        although an earlier one failed (``bookie.teardown``); the first failure is raised."""
        if not self._running:
            return
        self._running = False
        steps = Teardown(f"bookie {self.bookie_id}")
        await steps.run(self.companions.stop)
        await steps.run(self._deregister, True)
        await steps.run(self._close_server, False)
        await steps.run(self._cancel_background)
        complete = False
        if await steps.run(self.journal.stop):
            try:
                await self.checkpoint(release=False)
                complete = True
            except Exception:  # logged and counted by ``bookie.checkpoints``
                # With a journal nothing is lost: the next start replays it. Without one, adds
                # that never reached an entry log are gone, and the marker must make the next
                # start take the data-loss path (BP-46).
                complete = self.config.journal_write_data
        if await steps.run(self.storage.close) and complete:
            await steps.run(clear_marker, self._disk, self.config)  # only a clean stop clears it
        if self._owns_disk:
            await steps.run(self._disk.close)
        steps.raise_first()
        log.info("bookie %s stopped", self.bookie_id)

    async def crash(self) -> None:
        """Test hook: stop as a killed process would, without flushing or checkpointing."""
        if not self._running:
            return
        self._running = False
        steps = Teardown(f"bookie {self.bookie_id}")
        await steps.run(self.companions.stop)
        await steps.run(self._deregister, False)
        await steps.run(self._close_server, True)
        await steps.run(self._cancel_background)
        await steps.run(self.journal.crash)
        await steps.run(self.storage.close)
        if self._owns_disk:
            await steps.run(self._disk.close)
        steps.raise_first()

    async def _close_server(self, abort: bool) -> None:
        self.flow.stop()
        if self._server is not None:
            self._server.close()
        for conn in list(self.flow.connections):
            conn.abort() if abort else conn.close()
            conn.tasks.cancel()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._server.wait_closed()
            self._server = None

    @property
    def repairing(self) -> bool:
        """The boot-time repair (BP-46 phase two) is still running."""
        return self.background.running("repair")

    async def wait_repaired(self) -> None:
        """For tests and operators: until the boot-time repair (if any) has finished."""
        await self.background.wait("repair")

    async def _cancel_background(self) -> None:
        await self.disk_monitor.stop()
        await self.background.cancel_all()

    async def _deregister(self, clean: bool) -> None:
        await self.membership.close(clean)
        if self._owns_metadata and self._metadata is not None:
            await self._metadata.close()
            self._metadata = None

    # ------------------------------------------------------------------ checkpoints, GC

    def _write_error(self, exc: OSError) -> None:
        self.disk_monitor.report(exc)

    async def checkpoint(self, release: bool = True) -> None:
        """Make everything journaled so far durable in ledger storage; trim the journal
        (``bookie.checkpoints``: a failure is counted, logged and kept in
        ``checkpoint_error``)."""
        await self.checkpoints.checkpoint(release)

    async def collect_garbage(self, forced: bool = False) -> GcResult:
        """One pass reclaiming deleted ledgers' disk (``bookie.gc``); needs the metadata store.
        ``forced``: the disk is over its warning threshold (``bookie.disk_monitor``)."""
        return await self.gc.collect(forced)

    async def gc_report(self) -> dict[str, Any]:
        """Why each entry log's space is kept, and the pass running now (``bookie.gc_report``)."""
        return await self.gc.report()

    # ------------------------------------------------------------------ helpers

    def gauges(self) -> dict[str, int]:
        """Figures of the moment, beside the counters (GET_BOOKIE_INFO, metrics)."""
        return bookie_gauges(self)

    async def disk_usage(self) -> tuple[int, int]:
        """Free and total bytes of the data directory's filesystem."""
        return await self._disk.usage(self.config.data_dir)

    async def cluster_secret(self) -> bytes | None:
        """The cluster's key-request secret (``bookie.ops.ledger_key``), read from the store
        once it exists; None while no replication worker has made it, or without a store
        (``bookie.secret``: absent, it is asked for again at most every few seconds)."""
        return await self.secret.read()

    def log_corruption(self, exc: Exception) -> None:
        """Log a stored entry that cannot be served (it is answered EIO)."""
        log.error("bookie %s: cannot serve an entry: %s", self.bookie_id, exc)


__all__ = ["CHECKPOINT_RETRY", "REREGISTER_INTERVAL", "SOFTWARE_VERSION", "Bookie", "BookieAddress"]
