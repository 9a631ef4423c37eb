"""Ledger storage: entry logs for the bytes, the on-disk index (``bookie.index.entry_index``)
for where they are and for ledger state, and the states of the ledgers in use.

Memory is bounded by configuration, whatever the bookie holds on disk: the index's write
cache (``write_cache_max_size``), the engine's block cache (``index_cache_size``), the read cache
of entry bodies (``read_cache_max_size``) and the ledgers in use -- a ``LedgerState`` is loaded
from the index when a request names its ledger and dropped after a checkpoint once it is idle,
beyond ``ledger_state_cache_size`` of them.

A checkpoint (BookKeeper's SyncThread) makes everything the journal has handed over durable
here, so the journal before it can go:

1. put the records of changed ledgers in the write cache and seal it, synchronously, with the
   journal LSN applied so far;
2. write and fsync every entry log byte appended so far (covers every sealed location);
3. commit the sealed batch to the index (atomic, durable).

The caller then releases journal files at or below that LSN. A restart replays the journal
after the index's LSN: its cost follows the journal since the last checkpoint, not the data held.
"""

from __future__ import annotations

import functools
import heapq
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.disk import Disk
from aiobk.bookie.entrylog.format import CorruptEntryError
from aiobk.bookie.entrylog.logger import EntryLogger
from aiobk.bookie.index.engine import IndexDb
from aiobk.bookie.index.entry_index import EntryIndex, check_layout
from aiobk.bookie.ledger_state import LedgerState
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.upgrade.convert import upgrade_legacy_index

log = logging.getLogger(__name__)

INDEX_DIR = "index.db"

# Opens the index engine in a directory; by default the one the disk runs (``Disk.open_index``).
IndexOpener = Callable[[str], Awaitable[IndexDb]]


class ReadCache:
    """Entry bodies recently read from disk, by location, least recently used out first, at
    most ``max_bytes`` of them (BookKeeper's ReadCache; 0 turns it off)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._bodies: OrderedDict[int, bytes] = OrderedDict()

    def get(self, location: int) -> bytes | None:
        body = self._bodies.get(location)
        if body is not None:
            self._bodies.move_to_end(location)
        return body

    def put(self, location: int, body: bytes) -> None:
        if len(body) > self.max_bytes or location in self._bodies:
            return
        self._bodies[location] = body
        self.size += len(body)
        while self.size > self.max_bytes:
            _old, gone = self._bodies.popitem(last=False)
            self.size -= len(gone)


class LedgerMap:
    """The ledgers this bookie holds, as a read-only mapping over the index: lookups load a
    ledger's state on demand; iterating walks the index (ascending ids)."""

    def __init__(self, storage: LedgerStorage) -> None:
        self._storage = storage

    def get(self, ledger_id: int) -> LedgerState | None:
        return self._storage.get(ledger_id)

    def __getitem__(self, ledger_id: int) -> LedgerState:
        state = self._storage.get(ledger_id)
        if state is None:
            raise KeyError(ledger_id)
        return state

    def __contains__(self, ledger_id: object) -> bool:
        return isinstance(ledger_id, int) and self._storage.get(ledger_id) is not None

    def __iter__(self) -> Iterator[int]:
        return self._storage.ledger_ids()

    def __len__(self) -> int:
        return self._storage.held

    def values(self) -> Iterator[LedgerState]:
        return (state for _ledger_id, state in self.items())

    def items(self) -> Iterator[tuple[int, LedgerState]]:
        """Every ledger's state, each loaded: for tests and tools, not for a serving path
        (the bookie itself never walks every state)."""
        for ledger_id in list(self):
            state = self._storage.get(ledger_id)
            if state is not None:
                yield ledger_id, state


class LedgerStorage:
    def __init__(
        self,
        disk: Disk,
        config: BookieConfig,
        stats: BookieStats,
        on_write_error: Callable[[OSError], None] | None = None,
        open_index: IndexOpener | None = None,
    ) -> None:
        self._disk = disk
        self._base = config.ledgers_path
        self.config = config
        self.entry_logger = EntryLogger(
            disk,
            os.path.join(self._base, "entries"),
            max_log_size=config.entry_log_max_size,
            write_buffer_size=config.entry_log_write_buffer,
            stats=stats,
            on_write_error=on_write_error,
        )
        self._open_index = open_index or functools.partial(
            disk.open_index,
            cache_bytes=config.index_cache_size,
            write_buffer=config.index_write_buffer_size,
        )
        self._index: EntryIndex | None = None
        self._active: dict[int, LedgerState] = {}  # states in use (or not dropped yet)
        self.ledgers = LedgerMap(self)
        self.read_cache = ReadCache(config.read_cache_max_size)
        self.held = 0  # ledgers held (with a state in the index)
        self.journal_start: tuple[int, int] | None = None  # from the index at open
        self.stats = stats
        self.on_cache_full: Callable[[], None] | None = None  # asks for a checkpoint now

    @property
    def index(self) -> EntryIndex:
        assert self._index is not None, "open() first"
        return self._index

    async def open(self) -> int:
        """Open the index (upgrading an older format first); return the journal LSN it covers
        (and set ``journal_start``, where replay may begin reading)."""
        path = os.path.join(self._base, INDEX_DIR)
        db = await self._open_index(path)
        index = EntryIndex(db, self.config.write_cache_max_size)
        try:
            check_layout(db, path)
            await upgrade_legacy_index(self._disk, self._base, index)
        except BaseException:
            await db.close()
            raise
        self._index = index
        self.held = index.held()
        self.journal_start = index.journal_start()
        await self.entry_logger.open()
        return index.mark()

    # ------------------------------------------------------------------ ledger states

    def get(self, ledger_id: int) -> LedgerState | None:
        """The ledger's state, loaded from the index if it is not in use; None if not held."""
        state = self._active.get(ledger_id)
        if state is not None:
            return state
        index = self.index
        record = index.state(ledger_id)
        if record is None:
            return None
        state = self._active[ledger_id] = LedgerState.loaded(ledger_id, record, index)
        self.stats.ledger_states_loaded += 1
        return state

    def in_use(self, ledger_id: int) -> LedgerState | None:
        """The ledger's state if it is in memory; None says nothing about the index."""
        return self._active.get(ledger_id)

    def limbo_of(self, ledger_id: int) -> bool | None:
        """Whether the ledger is in limbo (None: not held), without loading its state."""
        state = self._active.get(ledger_id)
        if state is not None:
            return state.limbo
        record = self.index.state(ledger_id)
        return None if record is None else record.limbo

    def ledger_ids(self) -> Iterator[int]:
        """Every ledger held, ascending: the index's, merged with states not checkpointed yet."""
        last = -1
        for ledger_id in heapq.merge(self.index.ledgers(), sorted(self._active)):
            if ledger_id != last:
                last = ledger_id
                yield ledger_id

    def is_deleted(self, ledger_id: int) -> bool:
        return self.index.is_deleted(ledger_id)

    def create(self, ledger_id: int, master_key: bytes) -> LedgerState:
        active = self._active
        state = active[ledger_id] = LedgerState(ledger_id, master_key, self.index)
        self.held += 1
        if len(active) >= 2 * self.config.ledger_state_cache_size:
            self._cache_full()  # new ledgers pile up (a peer fencing ids by the thousand)
        return state

    def _cache_full(self) -> None:
        if self.on_cache_full is not None:
            self.on_cache_full()

    def delete_ledger(self, ledger_id: int) -> bool:
        """Forget a deleted ledger (garbage collection): a tombstone keeps it from coming back;
        long polls on it end."""
        state = self._active.pop(ledger_id, None)
        if state is None and self.index.state(ledger_id) is None:
            return False
        self.index.cache.delete_ledger(ledger_id)
        self.held -= 1
        if state is not None:
            waiters, state.waiters = state.waiters, set()
            for waiter in waiters:
                waiter.wake()
        return True

    def _evict(self) -> None:
        """Drop idle states beyond the cache's bound (their records are in the index)."""
        active = self._active
        excess = len(active) - self.config.ledger_state_cache_size
        if excess <= 0:
            return
        idle = [ledger_id for ledger_id, state in active.items() if state.idle][:excess]
        for ledger_id in idle:
            del active[ledger_id]
        self.stats.ledger_states_dropped += len(idle)

    @property
    def write_cache_bytes(self) -> int:
        return 0 if self._index is None else self._index.cache.memory

    @property
    def states_in_use(self) -> int:
        return len(self._active)

    # ------------------------------------------------------------------ entries

    def add_entry(self, state: LedgerState, entry_id: int, body: bytes) -> None:
        state.set_location(entry_id, self.entry_logger.append(state.ledger_id, entry_id, body))
        if self.index.cache.full:
            self._cache_full()

    def add_entries(self, state: LedgerState, entries: Sequence[tuple[int, bytes]]) -> None:
        """``add_entry`` of each (entry id, body) of one ledger, ids increasing."""
        locations = self.entry_logger.append_many(state.ledger_id, entries)
        state.set_locations([entry_id for entry_id, _body in entries], locations)
        if self.index.cache.full:
            self._cache_full()

    async def read_entry(
        self, state: LedgerState, entry_id: int, location: int | None = None
    ) -> bytes | None:
        """The stored body, None when absent; raises CorruptEntryError on a bad copy.
        ``location``: where the index said it was when the caller looked; if compaction moved
        the entry and removed its old log meanwhile, the index's current location is read."""
        if location is not None:
            try:
                return await self._read_at(state, entry_id, location)
            except CorruptEntryError:
                if state.location(entry_id) == location:
                    raise
        location = state.location(entry_id)
        if location < 0:
            return None
        return await self._read_at(state, entry_id, location)

    async def read_entries(
        self, state: LedgerState, first: int, last: int, max_bytes: int
    ) -> list[bytes]:
        """The stored bodies of entries ``first``.. on, consecutive, up to ``last``: as many
        as stay within ``max_bytes`` (the first always), ending before the first entry not
        stored here or not readable (a range read's answer). Empty when ``first`` is not
        stored; raises CorruptEntryError when ``first``'s copy is bad. The read cache is
        neither asked nor filled: a bulk copy reads each entry once."""
        wanted = list(enumerate(state.locations(first, last), first))
        if not wanted:
            return []
        try:
            return await self.entry_logger.read_many(state.ledger_id, wanted, max_bytes)
        except CorruptEntryError:
            # Compaction may have moved the first entry and removed its old log meanwhile:
            # read_entry looks again where the index says it is now, and raises if still bad.
            body = await self.read_entry(state, first, wanted[0][1])
            return [] if body is None else [body]

    async def _read_at(self, state: LedgerState, entry_id: int, location: int) -> bytes:
        cache = self.read_cache
        body = cache.get(location)
        if body is not None:
            self.stats.read_cache_hits += 1
        else:
            body = await self.entry_logger.read(location, state.ledger_id, entry_id)
            cache.put(location, body)
        return body

    # ------------------------------------------------------------------ checkpoints

    async def checkpoint(self, mark_lsn: int, start: tuple[int, int] | None = None) -> None:
        """Make everything up to journal LSN ``mark_lsn`` durable here (``start``: where the
        journal's next replay may begin reading, ``Journal.position`` taken before the mark)."""
        index = self.index
        for state in self._active.values():
            if state.meta_dirty:
                index.cache.put_state(state.ledger_id, state.record())
                state.meta_dirty = False
        index.cache.set_held(self.held)
        sealed = index.seal(mark_lsn, start)
        try:
            await self.entry_logger.sync()
        except BaseException:
            index.abandon(sealed)
            raise
        await index.commit(sealed)
        self.stats.checkpoints += 1
        self._evict()

    async def close(self) -> None:
        """Close the entry logs and the index; the index although the logs failed to."""
        try:
            await self.entry_logger.close()
        finally:
            if self._index is not None:
                await self._index.db.close()
