"""Who may make a bookie hold a ledger it does not hold yet: no squatting on ledger ids.

Theory of operation. A bookie learns a ledger from the first request that names it with a key
-- an add, a recovery add or a fencing read (``Ledgers.ensure``) -- and from then on every add,
fence, FORCE and explicit LAC of that ledger must carry that key. Without a check the first key
won: whoever guessed the next ledger ids (etcd revisions, predictable) could fence them with a
junk key, and their rightful writers met EUA on every bookie so squatted. Now a request that
would create a ledger's state, or teach its key to a state BP-46's boot made without one, is
first checked against the ledger's metadata (``KeyCheck.admit``):

- no such ledger in the metadata (never created, or deleted): ENOLEDGER;
- metadata with a salted key digest (``protocol.keys.key_digest``): the key must match it, else
  EUA -- on a fencing read, the stand-in key a replication worker makes with the cluster's
  secret for a ledger nobody knows the key of (``protocol.keys.stand_in_key``) passes too;
- legacy metadata (written before ledgers had a salt): its digest is of the password, which a
  key cannot be checked against, so only the ledger's existence is checked;
- the store unreachable or slow past ``LOOKUP_TIMEOUT``, or the metadata unreadable: EIO and
  nothing is created -- the client retries or changes its ensemble;
- a peer whose verified certificate has the ``bookie`` role, and a bookie that runs without a
  metadata store (nothing to check against): no lookup, the first key wins as before.

Ordering. Adds of one ledger must reach the journal in the order they came, so a request for a
ledger whose lookup is under way waits in that ledger's queue, and the answer runs the queue in
arrival order, each request judged by the one lookup (one lookup per ledger, however many
requests wait for it). A ledger the bookie already holds with its key never comes here: the
handlers go straight on, and its adds pay nothing for this.

Bounds and fairness (a peer flooding requests for ids that do not exist, I16). At most
``MAX_LOOKUPS`` lookups run at once; the others wait for a turn, taken round robin among the
connections that have lookups waiting, so a flood on some connections delays another's lookup by
about one lookup per flooding connection, not by the flood. One connection may have at most
``MAX_LOOKUPS_PER_PEER`` lookups running or waiting and ``MAX_WAITING_PER_PEER`` requests
waiting on lookups (its in-flight cap: it stops being read before it gets there); the bookie at
most ``MAX_PENDING`` lookups and ``MAX_WAITING`` requests. Past any of these the answer is
ETOOMANYREQUESTS at once. A store that refuses calls (etcd restarting) is asked again within
``LOOKUP_TIMEOUT``, so a lookup that lands just after it comes back is not an EIO. Answers for
ledgers that exist are kept (a ledger's salt and digest never change) for ``CACHE_TTL`` in an
LRU of ``CACHE_SIZE``; "no such ledger" is never kept, since the id may be created a moment
later by its rightful writer.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from aiobk.protocol import StatusCode
from aiobk.protocol.errors import MetadataStoreError, NoSuchLedgerError
from aiobk.protocol.keys import key_matches, stand_in_key
from aiobk.protocol.roles import BOOKIE
from aiobk.tasks import TaskKeeper

if TYPE_CHECKING:
    from aiobk.metadata import LedgerMetadata, MetadataStore

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT = 5.0  # seconds; under the client's add timeout (10 s), so it hears EIO first
RETRY_BACKOFF_MIN = 0.05  # seconds between reads of an unreachable store, doubling ...
RETRY_BACKOFF_MAX = 0.5  # ... up to this, within LOOKUP_TIMEOUT
MAX_LOOKUPS = 64  # running at once: each is one read of the metadata store
MAX_PENDING = 16_384  # running or waiting for a turn, every connection together
# Running or waiting, one connection: room for a client that creates many ledgers at once (each
# new ledger costs one lookup on each bookie of its ensemble) without letting one peer queue
# lookups without end.
MAX_LOOKUPS_PER_PEER = 256
# Requests of one connection waiting on lookups: as many as it may have in flight
# (``max_inflight_per_connection``, which the bookie passes), so an honest client that sends a
# new ledger's first thousands of adds at once meets backpressure (the connection stops being
# read at that many), never a refusal that would cost it the bookie.
MAX_WAITING_PER_PEER = 10_000
MAX_WAITING = 65_536  # requests waiting on lookups, every connection together
CACHE_SIZE = 4096  # ledgers whose salt and digest are remembered
CACHE_TTL = 60.0  # seconds: bounds how long a deleted ledger's answer outlives it here


@dataclass(frozen=True, slots=True)
class KeyFacts:
    """What the metadata says about a ledger's key: its salt (empty: legacy form) and digest."""

    salt: bytes
    digest: bytes


@dataclass(slots=True)
class KeyCheckStats:
    lookups: int = 0  # metadata reads made
    cache_hits: int = 0
    refused_busy: int = 0  # ETOOMANYREQUESTS: over a bound
    refused_absent: int = 0  # ENOLEDGER: no such ledger in the metadata
    refused_key: int = 0  # EUA: the key is not the one the digest names
    lookup_failures: int = 0  # EIO: the store could not answer
    rewrites_refused: int = 0  # adds of an entry held, with other bytes (``bookie.ops.add``)

    def as_dict(self) -> dict[str, int]:
        return {f"key_check_{name}": getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class _Peer:
    """One connection's share: lookups charged to it (running or waiting for a turn), its
    requests waiting on lookups, and the ledgers whose lookups wait for a turn."""

    key: object  # the connection
    lookups: int = 0
    waiting: int = 0
    queue: deque[int] = field(default_factory=deque)


@dataclass(slots=True)
class _Waiter:
    key: bytes
    fence: bool
    trusted: bool  # the peer has the bookie role
    peer: _Peer
    then: Callable[[StatusCode], None]


@dataclass(slots=True)
class _Lookup:
    peer: object  # the connection it is charged to
    waiters: list[_Waiter] = field(default_factory=list)


Admitted = Callable[[StatusCode], None]


class _Admin(Protocol):
    @property
    def running(self) -> bool: ...

    @property
    def metadata(self) -> MetadataStore | None: ...

    async def cluster_secret(self) -> bytes | None: ...


class _Stats(Protocol):
    auth_failures: int


class BookieContext(Protocol):
    """What a check needs of the bookie (``bookie.context.BookieContext`` has it; named
    here so this module does not import the one that holds it)."""

    @property
    def admin(self) -> _Admin: ...

    @property
    def stats(self) -> _Stats: ...


class KeyCheck:
    """One per bookie (``BookieContext.keys``); see the module docstring."""

    def __init__(
        self,
        *,
        timeout: float = LOOKUP_TIMEOUT,
        max_lookups: int = MAX_LOOKUPS,
        max_pending: int = MAX_PENDING,
        max_per_peer: int = MAX_LOOKUPS_PER_PEER,
        max_waiting_per_peer: int = MAX_WAITING_PER_PEER,
        max_waiting: int = MAX_WAITING,
        cache_size: int = CACHE_SIZE,
        cache_ttl: float = CACHE_TTL,
    ) -> None:
        self.timeout = timeout
        self.max_lookups = max_lookups
        self.max_pending = max_pending
        self.max_per_peer = max_per_peer
        self.max_waiting_per_peer = max_waiting_per_peer
        self.max_waiting = max_waiting
        self.cache_size = cache_size
        self.cache_ttl = cache_ttl
        self.stats = KeyCheckStats()
        self._pending: dict[int, _Lookup] = {}  # running or waiting for a turn
        self._running = 0
        self._peers: dict[object, _Peer] = {}
        self._turns: OrderedDict[object, None] = OrderedDict()  # peers with lookups queued
        self._waiting = 0
        self._cache: OrderedDict[int, tuple[float, KeyFacts]] = OrderedDict()
        self._tasks = TaskKeeper()
        self._logged: set[StatusCode] = set()

    @property
    def lookups_running(self) -> int:
        return self._running

    @property
    def lookups_pending(self) -> int:
        """Running or waiting for a turn."""
        return len(self._pending)

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def cached(self) -> int:
        return len(self._cache)

    def looking_up(self, ledger_id: int) -> bool:
        """Whether a lookup of the ledger runs or waits for a turn: a request for it now waits
        behind that lookup, whatever it is and whoever sends it (``admit``)."""
        return ledger_id in self._pending

    def admit(
        self,
        ctx: BookieContext,
        ledger_id: int,
        key: bytes,
        peer: object,
        roles: frozenset[str],
        then: Admitted,
        *,
        fence: bool = False,
    ) -> None:
        """Call ``then(EOK)`` once a request naming ``ledger_id`` with ``key`` may create its
        state (or teach its key to a keyless one), else ``then`` with the refusal -- now, or
        after a metadata lookup, in arrival order among the requests of one ledger. ``peer``
        is the connection (bounds and turns are per connection), ``fence`` a fencing read."""
        trusted = BOOKIE in roles
        lookup = self._pending.get(ledger_id)
        if lookup is not None:  # others of this ledger wait: behind them, whatever the peer
            self._wait(lookup, key, fence, trusted, peer, then)
            return
        if not key or trusted:
            then(StatusCode.EOK)  # no key: ``Ledgers.ensure`` refuses a new ledger (EBADREQ)
            return
        admin = ctx.admin
        if admin.metadata is None:
            # Serving without a store: a bookie run alone has nothing to check against. Not
            # running (the moments between starting to serve and being registered, and while
            # stopping) the store is not to be had here: not now, ask again (EIO).
            then(StatusCode.EOK if admin.running else StatusCode.EIO)
            return
        facts = self._cached(ledger_id)
        # A fence the digest refuses may carry a worker's stand-in key: that needs the secret,
        # which a lookup reads.
        if facts is not None and not (
            fence and key_matches(facts.salt, facts.digest, key) is False
        ):
            self.stats.cache_hits += 1
            then(self._verdict(ctx, ledger_id, facts, key, fence, None))
            return
        share = self._share(peer)
        if (
            share.lookups >= self.max_per_peer
            or share.waiting >= self.max_waiting_per_peer
            or len(self._pending) >= self.max_pending
            or self._waiting >= self.max_waiting
        ):
            self._forget_if_idle(share)
            self._refuse_busy(then)
            return
        share.lookups += 1
        lookup = self._pending[ledger_id] = _Lookup(peer)
        self._wait(lookup, key, fence, trusted, peer, then)
        self.stats.lookups += 1
        if self._running < self.max_lookups:
            self._start(ctx, ledger_id, lookup)
        else:
            share.queue.append(ledger_id)
            self._turns[peer] = None

    def forget(self, ledger_id: int) -> None:
        """Drop a cached answer (the ledger was deleted, or a test wants a fresh lookup)."""
        self._cache.pop(ledger_id, None)

    # ------------------------------------------------------------------ internals

    def _wait(
        self,
        lookup: _Lookup,
        key: bytes,
        fence: bool,
        trusted: bool,
        peer: object,
        then: Admitted,
    ) -> None:
        share = self._share(peer)
        if share.waiting >= self.max_waiting_per_peer or self._waiting >= self.max_waiting:
            self._forget_if_idle(share)
            self._refuse_busy(then)
            return
        share.waiting += 1
        self._waiting += 1
        lookup.waiters.append(_Waiter(key, fence, trusted, share, then))

    def _share(self, peer: object) -> _Peer:
        share = self._peers.get(peer)
        if share is None:
            share = self._peers[peer] = _Peer(peer)
        return share

    def _start(self, ctx: BookieContext, ledger_id: int, lookup: _Lookup) -> None:
        self._running += 1
        self._tasks.spawn(self._lookup(ctx, ledger_id, lookup))

    def _next_turns(self, ctx: BookieContext) -> None:
        """Start waiting lookups while there is room, one connection after the other."""
        turns = self._turns
        while turns and self._running < self.max_lookups:
            peer, _ = turns.popitem(last=False)
            share = self._peers.get(peer)
            if share is None or not share.queue:
                continue
            ledger_id = share.queue.popleft()
            if share.queue:
                turns[peer] = None  # its next one after every other connection's
            lookup = self._pending.get(ledger_id)
            if lookup is not None:
                self._start(ctx, ledger_id, lookup)

    def _refuse_busy(self, then: Admitted) -> None:
        self.stats.refused_busy += 1
        self._log_once(StatusCode.ETOOMANYREQUESTS, "key checks at their bound: refusing")
        then(StatusCode.ETOOMANYREQUESTS)

    def _cached(self, ledger_id: int) -> KeyFacts | None:
        found = self._cache.get(ledger_id)
        if found is None:
            return None
        expires, facts = found
        if asyncio.get_running_loop().time() >= expires:
            del self._cache[ledger_id]
            return None
        self._cache.move_to_end(ledger_id)
        return facts

    def _remember(self, ledger_id: int, facts: KeyFacts) -> None:
        cache = self._cache
        cache[ledger_id] = (asyncio.get_running_loop().time() + self.cache_ttl, facts)
        cache.move_to_end(ledger_id)
        while len(cache) > self.cache_size:
            cache.popitem(last=False)

    async def _lookup(self, ctx: BookieContext, ledger_id: int, lookup: _Lookup) -> None:
        facts: KeyFacts | None = None
        secret: bytes | None = None
        failure = StatusCode.EOK  # EOK: the metadata answered (facts None: no such ledger)
        store = ctx.admin.metadata
        try:
            if store is None:  # stopped meanwhile
                raise ConnectionError("the bookie is stopping")
            async with asyncio.timeout(self.timeout):
                try:
                    metadata = await self._read(store, ledger_id)
                except NoSuchLedgerError:
                    pass
                else:
                    facts = KeyFacts(metadata.password_salt, metadata.password_digest)
                    self._remember(ledger_id, facts)
                    if any(
                        w.fence and key_matches(facts.salt, facts.digest, w.key) is False
                        for w in lookup.waiters
                    ):
                        secret = await ctx.admin.cluster_secret()
        except asyncio.CancelledError:  # the loop is closing: answer, start nothing more
            self._finish(ctx, ledger_id, lookup, None, None, StatusCode.EIO, more=False)
            raise
        except Exception as exc:  # the store's errors, a timeout, unreadable metadata: EIO
            failure = StatusCode.EIO
            self.stats.lookup_failures += 1
            self._log_once(
                StatusCode.EIO,
                f"cannot look ledger {ledger_id} up in the metadata store ({exc!r}): "
                "refusing with EIO",
            )
        self._finish(ctx, ledger_id, lookup, facts, secret, failure)

    @staticmethod
    async def _read(store: MetadataStore, ledger_id: int) -> LedgerMetadata:
        """The ledger's metadata, asked again after a short pause while the store is
        unreachable (an etcd that just came back refuses calls until the bookie's client has
        reconnected); the caller's timeout bounds the whole."""
        backoff = RETRY_BACKOFF_MIN
        while True:
            try:
                return await store.read_ledger(ledger_id)
            except MetadataStoreError:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX)

    def _finish(
        self,
        ctx: BookieContext,
        ledger_id: int,
        lookup: _Lookup,
        facts: KeyFacts | None,
        secret: bytes | None,
        failure: StatusCode,
        *,
        more: bool = True,
    ) -> None:
        self._running -= 1
        if self._pending.get(ledger_id) is lookup:
            del self._pending[ledger_id]
        share = self._peers.get(lookup.peer)
        if share is not None:
            share.lookups -= 1
        waiters, lookup.waiters = lookup.waiters, []
        self._waiting -= len(waiters)
        for waiter in waiters:  # in arrival order: adds of one ledger keep theirs
            waiter.peer.waiting -= 1
            if waiter.trusted:
                status = StatusCode.EOK
            elif failure is not StatusCode.EOK:
                status = failure
            elif facts is None:
                status = StatusCode.ENOLEDGER
                self.stats.refused_absent += 1
                self._log_once(
                    StatusCode.ENOLEDGER,
                    f"a request for ledger {ledger_id}, which the metadata does not have: "
                    "refused (ENOLEDGER)",
                )
            else:
                status = self._verdict(ctx, ledger_id, facts, waiter.key, waiter.fence, secret)
            waiter.then(status)
        if share is not None:
            self._forget_if_idle(share)
        for waiter in waiters:
            self._forget_if_idle(waiter.peer)
        if more:
            self._next_turns(ctx)

    def _forget_if_idle(self, share: _Peer) -> None:
        """A connection with nothing charged any more is forgotten (it may have closed)."""
        idle = not (share.lookups or share.waiting or share.queue)
        if idle and self._peers.get(share.key) is share:
            del self._peers[share.key]

    def _verdict(
        self,
        ctx: BookieContext,
        ledger_id: int,
        facts: KeyFacts,
        key: bytes,
        fence: bool,
        secret: bytes | None,
    ) -> StatusCode:
        if not key or key_matches(facts.salt, facts.digest, key) is not False:
            return StatusCode.EOK  # right key, legacy metadata, or ``ensure`` refuses no key
        stand_in = stand_in_key(secret, ledger_id) if fence and secret is not None else None
        if stand_in is not None and hmac.compare_digest(key, stand_in):
            return StatusCode.EOK
        self.stats.refused_key += 1
        ctx.stats.auth_failures += 1
        self._log_once(
            StatusCode.EUA,
            f"a request for ledger {ledger_id} with a key its metadata does not name: "
            "refused (EUA)",
        )
        return StatusCode.EUA

    def _log_once(self, kind: StatusCode, message: str) -> None:
        """The first refusal of each kind is a warning; the rest are counted, logged at debug
        (a flood must not flood the log too)."""
        if kind in self._logged:
            log.debug("%s", message)
        else:
            self._logged.add(kind)
            log.warning("%s (further ones are counted in key_check_* and logged at debug)", message)


__all__ = ["KeyCheck", "KeyCheckStats", "KeyFacts"]
