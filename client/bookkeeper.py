"""``BookKeeper``: the client's entry point."""

from __future__ import annotations

import contextlib
import functools
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping

from aiobk.client.config import ClientConfig
from aiobk.client.context import ClientContext
from aiobk.client.digest import Digester
from aiobk.client.ledger_handle import LedgerHandle
from aiobk.client.log.by_time import position_at_time
from aiobk.client.log.position import LogPosition
from aiobk.client.log.producers import DEFAULT_RETENTION
from aiobk.client.log.reader import LogReader, check_deletes, truncate_log
from aiobk.client.log.writer import LogWriter, LogWriterSettings, open_log_writer
from aiobk.client.metadata_retry import MetadataRetry
from aiobk.client.net import Connector, TlsConnector
from aiobk.client.offload.copy import forget_offload
from aiobk.client.offload.log import OffloadReport, offload_log
from aiobk.client.passwords import check_delete, check_password, password_digest
from aiobk.client.placement import choose_ensemble
from aiobk.client.pool import BookiePool
from aiobk.client.read_handle import ReadHandle
from aiobk.client.recovery import LedgerRecovery
from aiobk.client.stats import bound_to_loop
from aiobk.client.store_read import entry_source
from aiobk.metadata import (
    ClusterRecord,
    Fragment,
    LedgerMetadata,
    MetadataStore,
    OffloadRecord,
    open_store,
)
from aiobk.protocol import DigestType, Durability, master_key
from aiobk.protocol.errors import LedgerExistsError, NoSuchLedgerError
from aiobk.protocol.keys import SALT_SIZE
from aiobk.tiered.open import StoreCache


class BookKeeper:
    """The client: creates, opens, reads and deletes ledgers and logs of one cluster.

    ``async with BookKeeper(uri) as bk`` (or ``async with await BookKeeper.connect(uri) as
    bk``) closes it, and the store it opened, on exit. One client holds one connection per
    bookie, shared by all its ledgers, and one budget of unfinished appends
    (``ClientConfig.max_outstanding_adds`` and ``max_outstanding_bytes``) across them.

    Attributes:
        config: The client's settings.
        store: The metadata store it uses.
        stats: Its figures (appends, ensemble changes, recoveries, reads), which
            ``aiobk.metrics.register_client_metrics`` exports.
        cluster: The cluster record read when connecting to a URI (its ``instance_id``);
            None before connecting, when given a store, or for a cluster set up by 0.1.0
            that no newer bookie has booted in yet.
    """

    def __init__(
        self,
        metadata: str | MetadataStore,
        config: ClientConfig | None = None,
        *,
        rng: random.Random | None = None,
        connector: Connector | None = None,
        wall_clock: Callable[[], float] = time.time,
        owns_store: bool | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """A client for the cluster whose metadata lives at ``metadata``. No I/O happens here.

        Args:
            metadata: A metadata URI (``etcd://HOST:PORT[,HOST:PORT...]/PREFIX``,
                ``etcds://...``, ``memory://NAME``), opened here and closed with the client;
                or a ``MetadataStore``, the caller's, left open unless ``owns_store``.
            config: Timeouts, budgets and defaults; ``ClientConfig()`` when None.
            rng: The random source for placement and salts (seeded in the simulator).
            connector: How bookie connections are made (a test or simulator seam).
            wall_clock: The clock of creation times and record timestamps.
            owns_store: Whether ``close()`` closes the store (default: only one it opened).
            tls: An ``ssl.SSLContext``: every bookie connection is upgraded to TLS before
                its first request, or fails (never plaintext); its certificate, if it has
                one, is the client's identity.

        Raises:
            ValueError: The URI is malformed.
        """
        config = config or ClientConfig()
        if tls is not None:
            connector = TlsConnector(tls, connector)
        if isinstance(metadata, str):
            store = open_store(metadata, timeout=config.metadata_timeout)
            owns_store = True if owns_store is None else owns_store
        else:
            store = metadata
            owns_store = False if owns_store is None else owns_store
        self.store = store
        self.config = config
        self._rng = rng or random.Random()
        self._wall_clock = wall_clock
        self.pool = BookiePool(store, config, connector)
        # What every ledger of this client shares, among it one budget of unfinished appends
        # (backpressure.py).
        self.context = ClientContext.build(store, self.pool, config, self._rng)
        self.add_budget = self.context.budget
        # Appends, ensemble changes, recoveries, reads (aiobk.metrics.register_client_metrics).
        self.stats = self.context.stats
        self._owns_store = owns_store
        # The object stores offloaded ledgers are read from and written to, one per URL.
        self.objects = StoreCache()
        self._closed = False
        # A store the caller built is the caller's to vouch for (in-process wiring, the
        # simulator); a URI is checked for a cluster when connecting.
        self._check_cluster = isinstance(metadata, str)
        self.cluster: ClusterRecord | None = None

    @classmethod
    async def connect(
        cls,
        metadata: str | MetadataStore,
        config: ClientConfig | None = None,
        *,
        rng: random.Random | None = None,
        connector: Connector | None = None,
        wall_clock: Callable[[], float] = time.time,
        tls: ssl.SSLContext | None = None,
    ) -> BookKeeper:
        """A connected client.

        Args:
            metadata: As for the constructor (a URI or a store).
            config: As for the constructor.
            rng: As for the constructor.
            connector: As for the constructor.
            wall_clock: As for the constructor.
            tls: As for the constructor.

        Returns:
            The client, to be closed with ``close()`` or ``async with``.

        Raises:
            NoSuchClusterError: The URI's prefix holds no cluster (no bookie ever started
                with it).
            MetadataStoreError: The metadata store is unreachable.
        """
        bk = cls(metadata, config, rng=rng, connector=connector, wall_clock=wall_clock, tls=tls)
        await bk._connect()
        return bk

    async def _connect(self) -> None:
        """What connecting takes (``connect()`` and ``async with`` share it): given a URI, one
        read of the cluster record, so that a prefix where no cluster was ever set up fails
        here (``NoSuchClusterError``) instead of looking like an empty cluster, and an
        unreachable store fails here too (``MetadataStoreError``). Bookie connections open on
        first use."""
        if self._closed:
            raise RuntimeError("this BookKeeper is closed; make a new one")
        self.stats.clock = bound_to_loop(self.stats.clock)  # this loop's, read directly
        if self._check_cluster:
            self.cluster = await self.store.check_cluster()

    async def __aenter__(self) -> BookKeeper:
        await self._connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every bookie connection, and the metadata store if the client owns it.

        Idempotent. Ledger handles are not closed: close them first (``LedgerHandle.close``)
        or their open ledgers are left for a reader's recovery.
        """
        if self._closed:
            return
        self._closed = True
        await self.pool.close()
        await self.objects.close()
        if self._owns_store:
            await self.store.close()

    # ------------------------------------------------------------------ ledgers

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        *,
        password: bytes = b"",
        durability: Durability = Durability.PERSISTENT,
        custom_metadata: Mapping[str, bytes] | None = None,
        digest_type: DigestType | None = None,
    ) -> LedgerHandle:
        """Create a ledger on ``ensemble_size`` writable bookies, open for appends.

        Args:
            ensemble_size: Bookies the ledger's entries are striped over (E).
            write_quorum: Copies of each entry written (WQ); ``E >= WQ``.
            ack_quorum: Copies that must confirm an entry before its append returns (AQ).
            password: The ledger's password: its master key (sent with every write) and
                the key of a ``mac`` digest derive from it; needed to open or delete it.
            durability: ``PERSISTENT`` (acknowledged once fsynced) or ``VOLATILE``
                (acknowledged once written; the LAC follows what is synced, BP-14).
            custom_metadata: Application bytes kept in the ledger's metadata.
            digest_type: ``CRC32C`` or ``MAC``; ``ClientConfig.digest_type`` when None.

        Returns:
            The handle to append through; close it (or use ``async with``) when done.

        Raises:
            ValueError: The quorums are inconsistent, or a volatile ledger is striped.
            NotEnoughBookiesError: Fewer than ``ensemble_size`` writable bookies.
            MetadataStoreError: The metadata store stayed unreachable.
        """
        if not ensemble_size >= write_quorum >= ack_quorum >= 1:
            raise ValueError(
                "need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                f"{ensemble_size}/{write_quorum}/{ack_quorum}"
            )
        if durability is Durability.VOLATILE and ensemble_size != write_quorum:
            raise ValueError(
                "volatile durability needs ensemble_size == write_quorum (BP-14: no striping)"
            )
        kind = digest_type if digest_type is not None else self.config.digest_type
        # An unreachable store (etcd restarting, electing a leader) is ridden out for
        # metadata_retry_timeout, as ensemble changes and closes are: a log writer's roll to a
        # new ledger must not fail for a blip.
        retry = MetadataRetry(self.config, "creating a ledger")
        bookies = await retry.call(
            "listing the writable bookies", functools.partial(self.pool.writable_bookies, True)
        )
        avoid = self.pool.recently_failed()  # registered, but its lease has not run out yet
        if len(set(bookies) - avoid) < ensemble_size:
            avoid = set()
        spread = self.pool.spread()
        ensemble = choose_ensemble(
            bookies, ensemble_size, avoid, self._rng, write_quorum=write_quorum, spread=spread
        )
        self.context.check_spread(ensemble, write_quorum, spread, "a new ledger")
        # A fresh salt per ledger, from the client's random source (seeded in the simulator,
        # from the OS otherwise): not secret, only unlike every other ledger's.
        salt = self._rng.randbytes(SALT_SIZE)
        metadata = LedgerMetadata(
            ensemble_size,
            write_quorum,
            ack_quorum,
            (Fragment(0, tuple(ensemble)),),
            durability=durability,
            digest_type=kind,
            password_digest=password_digest(password, salt),
            custom_metadata=dict(custom_metadata or {}),
            creation_time=int(self._wall_clock() * 1000),
            password_salt=salt,
        )
        ledger_id, metadata = await self._create(retry, metadata)
        return LedgerHandle(
            self.context,
            ledger_id=ledger_id,
            metadata=metadata,
            master_key=master_key(password),
            digest=Digester(kind, password),
        )

    async def _create(
        self, retry: MetadataRetry, metadata: LedgerMetadata
    ) -> tuple[int, LedgerMetadata]:
        """Allocate an id and store ``metadata`` under it, both retried while the store is
        unreachable. A create whose first attempt landed but whose answer was lost comes back
        as "exists": the stored metadata is then ours if it is what we wrote (creation time,
        password digest, ensemble and all); an id another client took gets a new one."""
        store = self.store
        for _attempt in range(self.config.metadata_retries):
            ledger_id = await retry.call("allocating a ledger id", store.allocate_ledger_id)
            try:
                created = await retry.call(
                    "storing its metadata",
                    functools.partial(store.create_ledger, ledger_id, metadata),
                )
            except LedgerExistsError:
                existing = await retry.call(
                    "reading it back", functools.partial(store.read_ledger, ledger_id)
                )
                if existing == metadata:
                    return ledger_id, existing
                continue
            return ledger_id, created
        raise LedgerExistsError("could not find a free ledger id")

    async def open_ledger(
        self, ledger_id: int, password: bytes = b"", recovery: bool = True
    ) -> ReadHandle:
        """Open a ledger for reading.

        Args:
            ledger_id: The ledger.
            password: Its password.
            recovery: With recovery (the default) an unclosed ledger is fenced, recovered
                and closed first, so its writer can add nothing more; without, nothing is
                changed and reads stop at the last add confirmed its bookies report.

        Returns:
            A read handle, its ``last_add_confirmed`` known.

        Raises:
            NoSuchLedgerError: No such ledger.
            UnauthorizedError: Wrong password.
            LedgerRecoveryError: Recovery could not decide the last entry (retriable).
        """
        metadata = await self.store.read_ledger(ledger_id)
        check_password(ledger_id, metadata, password)
        digest = Digester(metadata.digest_type, password)
        if recovery and not metadata.is_closed:
            metadata = await LedgerRecovery(
                self.context, ledger_id=ledger_id, master_key=master_key(password), digest=digest
            ).run(metadata)
        handle = ReadHandle(
            self.context,
            ledger_id=ledger_id,
            metadata=metadata,
            reader=entry_source(self.context, self.objects, ledger_id, metadata, digest),
        )
        if not metadata.is_closed:
            await handle.read_last_add_confirmed()
        return handle

    async def delete_ledger(
        self, ledger_id: int, password: bytes | None = None, *, force: bool = False
    ) -> None:
        """Delete a ledger: its metadata goes now, its data at each bookie's next garbage
        collection pass.

        The password is checked against the digest in the metadata as ``open_ledger`` checks
        it; a ledger created without a password needs none. The check guards against mistakes
        and wrong passwords; it cannot stop a party that writes the metadata store directly
        (etcd's own access control on the prefix is that barrier: docs/operations/security.md).

        Args:
            ledger_id: The ledger.
            password: Its password.
            force: Skip the password check (an operator's delete), and the metadata read it
                takes: the object of an offloaded ledger deleted so is removed by the
                autorecovery leader's next offload pass instead of at once.

        Raises:
            NoSuchLedgerError: No such ledger.
            UnauthorizedError: Wrong password.
        """
        if force:
            await self.store.delete_ledger(ledger_id)
            return  # an object it had goes at the autorecovery leader's next offload pass
        metadata = await self.store.read_ledger(ledger_id)
        check_delete(ledger_id, metadata, password)
        await self.store.delete_ledger(ledger_id)
        if metadata.offload is not None:
            await self.forget_offload(ledger_id, metadata.offload)

    async def forget_offload(self, ledger_id: int, record: OffloadRecord) -> None:
        """After a ledger is deleted, remove what its offload left: its object in the store
        and its entry in the offload work list (a store that fails leaves the object for the
        sweep). Deleting and truncating call it; an application rarely needs to.

        Args:
            ledger_id: The deleted ledger.
            record: Its offload record, read before the deletion.
        """
        await forget_offload(self.context, self.objects, ledger_id, record)

    async def list_ledgers(self) -> AsyncIterator[int]:
        """Every ledger id in the cluster, ascending, read from the metadata a page at a time.

        Yields:
            Ledger ids.
        """
        async for ledger_id in self.store.list_ledgers():
            yield ledger_id

    # ------------------------------------------------------------------ logs

    async def open_log_writer(
        self,
        name: str,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        password: bytes = b"",
        durability: Durability = Durability.PERSISTENT,
        roll_bytes: int = 256 * 1024 * 1024,
        roll_seconds: float | None = None,
        create: bool = True,
        record_format: str | None = None,
        producer_id: str | None = None,
        producer_retention: float = DEFAULT_RETENTION,
    ) -> LogWriter:
        """Become the log's writer: fence the previous one and start a new ledger
        (docs/design/logs.md).

        Args:
            name: The log.
            ensemble_size: E of the log's ledgers.
            write_quorum: WQ of the log's ledgers.
            ack_quorum: AQ of the log's ledgers.
            password: The ledgers' password; every writer of one log must use the same.
            durability: As for ``create_ledger``.
            roll_bytes: Start a new ledger past this many payload bytes.
            roll_seconds: ... or after this long (None: no time limit).
            create: Create the log if it does not exist (else ``NoSuchLogError``).
            record_format: The format a new log is created with: ``"envelope"`` (the default:
                records with a key, headers and a timestamp, stamped with the client's wall
                clock unless ``append`` is given one) or ``"raw"`` (the payload alone). An
                existing log keeps its own.
            producer_id: Append as this producer (1 to 255 bytes of UTF-8): each record
                carries it and a sequence, the writer learns the producer's last sequence in
                the log (``LogWriter.last_sequence``), and an append of a sequence not above
                it is not appended again -- exactly once across crashes and takeovers. Needs
                an envelope log.
            producer_retention: Seconds a producer that appends nothing is remembered by
                the log (default 7 days); at most 1,000 producers are kept per log.

        Returns:
            The writer. Close it when done.

        Raises:
            NoSuchLogError: No such log and ``create`` is false.
            ValueError: ``record_format`` differs from the existing log's; a
                ``producer_id`` that is empty or too long, or on a raw log.
            LogFencedError: Another writer took the log while this one was opening.
        """
        settings = LogWriterSettings(
            ensemble_size, write_quorum, ack_quorum, password, durability, roll_bytes,
            roll_seconds, create, record_format, self._wall_clock, producer_id,
            producer_retention,
        )  # fmt: skip
        return await open_log_writer(self, name, settings)

    async def open_log_reader(
        self,
        name: str,
        start: LogPosition = LogPosition.EARLIEST,
        password: bytes = b"",
        *,
        follow: bool = True,
    ) -> LogReader:
        """A reader of the log from ``start`` (inclusive). Neither mode fences anything.

        Args:
            name: The log.
            start: The first position to read (``LogPosition.EARLIEST``: the whole log).
            password: The log's ledgers' password.
            follow: Following (the default), the reader tails live appends across ledgers
                and never ends on its own; with False it stops at the end of the log as seen
                now (the ledgers the log has now, the last one up to the LAC its bookies
                report now: ``reader.end``).

        Returns:
            An async iterator of ``LogRecord``.

        Raises:
            NoSuchLogError: No such log.
        """
        reader = LogReader(self, name, start, password, follow=follow)
        if follow:
            await self.store.read_log(name)  # NoSuchLogError now rather than at the first record
        else:
            await reader.find_end()
        return reader

    async def log_position_at_time(
        self, name: str, timestamp: int, password: bytes = b""
    ) -> LogPosition | None:
        """Find the first record stamped at or after a time, by binary search over the log's
        ledgers and then one ledger's entries (about log2(ledgers) + log2(entries) reads).

        Assumes stamps do not decrease along the log, which holds for the writer's default
        clock.

        Args:
            name: A log of envelope records.
            timestamp: Milliseconds since the epoch.
            password: The log's ledgers' password.

        Returns:
            That record's position, or None when every record is older.

        Raises:
            NoSuchLogError: No such log.
        """
        return await position_at_time(self, name, timestamp, password)

    async def truncate_log(
        self,
        name: str,
        before: LogPosition,
        password: bytes | None = None,
        *,
        force: bool = False,
    ) -> list[int]:
        """Drop (and delete) the log's ledgers wholly below ``before``; never the last one.

        Each ledger is deleted as ``delete_ledger`` deletes, with ``password`` (the log's
        writers'), all checked before the log changes, so a refusal changes nothing.

        Args:
            name: The log.
            before: The first position to keep.
            password: The log's ledgers' password.
            force: Skip the password check.

        Returns:
            The ids of the ledgers deleted.

        Raises:
            NoSuchLogError: No such log.
            UnauthorizedError: Wrong password.
        """
        return await truncate_log(self, name, before, password, force=force)

    async def offload_log(
        self,
        name: str,
        before: LogPosition | None = None,
        password: bytes | None = None,
    ) -> OffloadReport:
        """Copy the log's closed ledgers (those wholly before ``before``, or all of them) into
        the cluster's object store; readers then read them from the store once the bookies
        have released them (docs/design/tiered-storage.md).

        Each ledger becomes one object, read back and checked before its metadata records
        it. The bookies keep their copies until the store's deletion lag has passed (the
        autorecovery leader releases them then; with a lag of 0 this call does). Ledgers
        offloaded before, and the log's open ledger, are left as they are.

        Args:
            name: The log.
            before: The first position to keep on the bookies only.
            password: The log's ledgers' password, to check every entry's digest on the
                way (without it, a MAC ledger's entries are checked by their ids).

        Returns:
            What was done to each ledger.

        Raises:
            NoSuchLogError: No such log.
            NoOffloadStoreError: The cluster has no offload store.
            ObjectStoreError: The store failed; what was done so far is kept, and the call
                may be repeated.
        """
        return await offload_log(
            self.context, self.objects, name, before=before, password=password,
            now=self._wall_clock,
        )  # fmt: skip

    async def list_logs(self) -> AsyncIterator[str]:
        """Every log name in the cluster, read from the metadata.

        Yields:
            Log names.
        """
        async for name in self.store.list_logs():
            yield name

    async def delete_log(
        self, name: str, password: bytes | None = None, *, force: bool = False
    ) -> list[int]:
        """Delete the log and every ledger in it.

        The ledgers are deleted as ``delete_ledger`` deletes, with ``password``, all checked
        before the log record goes.

        Args:
            name: The log.
            password: Its ledgers' password.
            force: Skip the password check.

        Returns:
            The ids of the ledgers deleted.

        Raises:
            NoSuchLogError: No such log.
            UnauthorizedError: Wrong password.
        """
        record = await self.store.read_log(name)
        offloaded = {} if force else await check_deletes(self, record.ledgers, password)
        await self.store.delete_log(name, record.version)
        for ledger_id in record.ledgers:
            with contextlib.suppress(NoSuchLedgerError):
                await self.delete_ledger(ledger_id, force=True)
            if ledger_id in offloaded:
                await self.forget_offload(ledger_id, offloaded[ledger_id])
        return list(record.ledgers)
