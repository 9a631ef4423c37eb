"""One connection per bookie, opened on demand, reconnected with backoff.

A bookie id is resolved to an address through the registry (its published ``address``), or
read as ``host:port`` when it is not registered (a bookie that is down still has entries other
bookies hold copies of, and its id is its address by default). After a failed connect the bookie
is skipped for a backoff that doubles up to a limit, so a dead bookie costs one fast
``BookieUnavailableError`` per request rather than a connect timeout each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from aiobk.client.config import ClientConfig
from aiobk.client.connection import BookieConnection
from aiobk.client.net import AsyncioConnector, Connector
from aiobk.client.placement import Spread, read_order
from aiobk.metadata import MetadataStore
from aiobk.protocol import Response
from aiobk.protocol.errors import BKError, BookieUnavailableError, MetadataStoreError
from aiobk.tasks import TaskKeeper

log = logging.getLogger(__name__)

T = TypeVar("T")
ResponseCallback = Callable[[Response | BKError], None]
# Sends whose frames are made once the connection is there (they depend on its protocol
# version): called with the open connection, or with the error that stopped the connect.
Delivery = Callable[[BookieConnection | BKError], None]


class BookiePool:
    def __init__(
        self,
        store: MetadataStore,
        config: ClientConfig,
        connector: Connector | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._connector = connector or AsyncioConnector()
        self._connections: dict[str, BookieConnection] = {}
        self._connecting: dict[str, asyncio.Future[BookieConnection]] = {}
        self._down_until: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._addresses: dict[str, str] = {}
        self._racks: dict[str, str] = {}  # each bookie's, as last listed (placement.Spread)
        self.txn_ids = itertools.count(1)
        self._writable: tuple[float, list[str]] | None = None
        self._closed = False
        self._tasks = TaskKeeper()

    async def writable_bookies(self, fresh: bool = False) -> list[str]:
        """Ids of bookies registered as writable (cached briefly)."""
        loop = asyncio.get_running_loop()
        cached = self._writable
        if (
            not fresh
            and cached is not None
            and loop.time() - cached[0] < self._config.bookie_list_ttl
        ):
            return cached[1]
        infos = await self._store.list_bookies(writable_only=True)
        for info in infos:
            self._addresses[info.bookie_id] = info.address
            self._racks[info.bookie_id] = info.rack
        ids = [info.bookie_id for info in infos]
        self._writable = (loop.time(), ids)
        return ids

    def spread(self) -> Spread | None:
        """How placement spreads copies: the racks of the bookies listed so far (a bookie gone
        since keeps the rack it was listed with) and the client's rules (None: it does not)."""
        config = self._config
        if not config.switches.spread_over_racks:
            return None
        return Spread(
            dict(self._racks), config.min_racks_per_write_quorum, config.enforce_min_racks
        )

    def read_order(self, bookies: list[str]) -> list[str]:
        """The order to ask ``bookies`` for an entry: the client's rack first, then its zone
        (``ClientConfig.rack``; unset: as given)."""
        if self._config.rack is None:
            return bookies
        return read_order(bookies, self._config.rack, Spread(self._racks))

    def recently_failed(self) -> set[str]:
        """Bookies whose last connection attempt failed and whose backoff has not run out:
        placement avoids them while there are others."""
        now = asyncio.get_running_loop().time()
        return {b for b, until in self._down_until.items() if until > now}

    async def _address(self, bookie_id: str) -> tuple[str, int]:
        address = self._addresses.get(bookie_id)
        if address is None:
            with contextlib.suppress(MetadataStoreError, BKError):
                await self.writable_bookies(fresh=True)
            address = self._addresses.get(bookie_id, bookie_id)
        host, _sep, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise BookieUnavailableError(f"bookie {bookie_id!r} has no usable address {address!r}")
        return host, int(port)

    def get_nowait(self, bookie_id: str) -> BookieConnection | None:
        """The open connection to ``bookie_id``, if there is one (the hot path)."""
        conn = self._connections.get(bookie_id)
        if conn is not None and not conn.closed:
            return conn
        return None

    async def get(self, bookie_id: str, patience: float = 0.0) -> BookieConnection:
        """The connection to ``bookie_id``, made if need be. A bookie whose last connection
        failed is not tried again until its backoff ends: ``BookieUnavailableError`` at once,
        unless the backoff ends within ``patience`` seconds, which are waited out first."""
        conn = self.get_nowait(bookie_id)
        if conn is not None:
            return conn
        if self._closed:
            raise BookieUnavailableError("client is closed")
        loop = asyncio.get_running_loop()
        down_until = self._down_until.get(bookie_id, 0.0)
        if 0 < down_until - loop.time() <= patience:
            await asyncio.sleep(down_until - loop.time())
            conn = self.get_nowait(bookie_id)  # another request may have connected meanwhile
            if conn is not None:
                return conn
            if self._closed:
                raise BookieUnavailableError("client is closed")
        elif loop.time() < down_until:
            raise BookieUnavailableError(
                f"bookie {bookie_id} failed recently; retrying in {down_until - loop.time():.2f}s"
            )
        pending = self._connecting.get(bookie_id)
        if pending is None:
            pending = loop.create_future()
            self._connecting[bookie_id] = pending
            self._tasks.spawn(self._connect(bookie_id, pending))
        return await asyncio.shield(pending)

    async def _connect(self, bookie_id: str, result: asyncio.Future[BookieConnection]) -> None:
        loop = asyncio.get_running_loop()
        try:
            host, port = await self._address(bookie_id)
            conn = await BookieConnection.open(
                host,
                port,
                timeout=self._config.connect_timeout,
                connector=self._connector,
                expected_bookie_id=bookie_id,
                txn_ids=self.txn_ids,
            )
        except BKError as exc:
            backoff = min(
                self._backoff.get(bookie_id, self._config.reconnect_backoff_min / 2) * 2,
                self._config.reconnect_backoff_max,
            )
            self._backoff[bookie_id] = backoff
            self._down_until[bookie_id] = loop.time() + backoff
            log.info("bookie %s unavailable (%s); next try in %.2fs", bookie_id, exc, backoff)
            if not result.done():
                result.set_exception(exc)
            result.exception()  # retrieved: callers may all have gone
        else:
            self._backoff.pop(bookie_id, None)
            self._down_until.pop(bookie_id, None)
            if self._closed:
                conn.close()
                result.set_exception(BookieUnavailableError("client is closed"))
                result.exception()
            else:
                self._connections[bookie_id] = conn
                result.set_result(conn)
        finally:
            self._connecting.pop(bookie_id, None)

    def mark_failed(self, bookie_id: str) -> None:
        """Drop a connection that misbehaved (a timeout); the next request reconnects."""
        conn = self._connections.pop(bookie_id, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        self._closed = True
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
        for pending in list(self._connecting.values()):
            with_result = pending.done()
            if not with_result:
                await asyncio.wait([pending], timeout=self._config.connect_timeout)


SEND_PATIENCE = 0.5  # seconds of a bookie's reconnect backoff a send waits out (Sender)


class Sender(Generic[T]):
    """The sends of one owner (a ledger's add pipeline) to the pool's bookies, in order per
    bookie.

    A send to a bookie whose connection is open goes straight to it (the hot path). One to a
    bookie whose connection is still being made waits in a backlog that one task per bookie
    hands over once it connects -- or fails, each callback getting the error. Later sends queue
    behind the backlog, so a bookie never sees a later add (or a FORCE sent after ``sent``)
    before an earlier one. ``withdraw`` gives up what is still queued (the owner is closing):
    ``on_withdrawn`` gets each send's ``tag``, as it was never sent and gets no answer."""

    def __init__(self, pool: BookiePool, timeout: float, on_withdrawn: Callable[[T], None]) -> None:
        self._pool = pool
        self._timeout = timeout
        self._on_withdrawn = on_withdrawn
        self._backlog: dict[str, list[tuple[Delivery, T]]] = {}
        self._handed_over: dict[str, asyncio.Future[None]] = {}
        self._tasks = TaskKeeper()

    def send(
        self,
        bookie: str,
        txn_id: int,
        frame: bytes,
        callback: ResponseCallback,
        tag: T,
        flush: bool = False,
    ) -> None:
        """Send ``frame`` (an encoded request with ``txn_id``); ``callback`` gets its answer
        or failure, exactly once. ``flush``: write it now rather than at the end of the loop
        turn (nothing else is in flight to batch it with)."""
        if bookie not in self._backlog:
            conn = self._pool.get_nowait(bookie)
            if conn is not None:
                conn.send_frame(txn_id, frame, self._timeout, callback, flush)
                return
        timeout = self._timeout

        def deliver(conn: BookieConnection | BKError) -> None:
            if isinstance(conn, BKError):
                callback(conn)
            else:
                conn.send_frame(txn_id, frame, timeout, callback)

        self._queue(bookie, deliver, tag)

    def deliver(self, bookie: str, delivery: Delivery, tag: T) -> None:
        """As ``send``, for sends made by ``delivery`` from the open connection (now, if it is
        open and nothing waits before them) -- or given the error, if the connect fails. It
        sends with the connection's ``send_frame`` and this sender's ``timeout``."""
        if bookie not in self._backlog:
            conn = self._pool.get_nowait(bookie)
            if conn is not None:
                delivery(conn)
                return
        self._queue(bookie, delivery, tag)

    @property
    def timeout(self) -> float:
        return self._timeout

    def _queue(self, bookie: str, delivery: Delivery, tag: T) -> None:
        backlog = self._backlog.get(bookie)
        if backlog is None:
            loop = asyncio.get_running_loop()
            backlog = self._backlog[bookie] = []
            self._handed_over[bookie] = loop.create_future()
            self._tasks.spawn(self._after_connect(bookie))
        backlog.append((delivery, tag))

    async def _after_connect(self, bookie: str) -> None:
        try:
            # A backoff about to end, set by another request's failed connect (a bookie that
            # was restarting a moment ago), is waited out: failing these sends at once would
            # change the ledger's ensemble away from a bookie that is back.
            conn = await self._pool.get(bookie, patience=SEND_PATIENCE)
        except BKError as exc:
            for delivery, _tag in self._end_backlog(bookie):
                delivery(exc)
            return
        except asyncio.CancelledError:  # withdrawn: these sends go nowhere
            for _delivery, tag in self._end_backlog(bookie):
                self._on_withdrawn(tag)
            raise
        for delivery, _tag in self._end_backlog(bookie):
            delivery(conn)

    def _end_backlog(self, bookie: str) -> list[tuple[Delivery, T]]:
        backlog = self._backlog.pop(bookie, [])
        done = self._handed_over.pop(bookie, None)
        if done is not None and not done.done():
            done.set_result(None)
        return backlog

    async def sent(self, bookie: str) -> None:
        """Until every send so far to ``bookie`` is with its connection (or failed to
        connect): a request sent after this cannot overtake them."""
        done = self._handed_over.get(bookie)
        if done is not None:
            await asyncio.shield(done)

    async def withdraw(self) -> None:
        """Give up every send still waiting for a connection (see the class docstring)."""
        await self._tasks.cancel_and_wait()
