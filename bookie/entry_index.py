"""Entry locations and ledger state on the on-disk index, with a write cache (issue 15;
BookKeeper's DbLedgerStorage: EntryLocationIndex, LedgerMetadataIndex and its WriteCache).

Theory of operation. What changed since the last checkpoint -- new entry locations, ledger
states, deleted ledgers -- waits in memory (the write cache); everything older is in the
``IndexDb`` (RocksDB in production, its twin in the simulator). ``flush(mark)`` writes the whole
cache as one atomic, durable batch together with the journal LSN it covers, so after a crash
the index is exactly as of some checkpoint and the journal after that LSN replays the rest.

The caller keeps the order that makes this safe (bookie.storage): entry-log bytes are synced
*before* the flush that names them, and the journal is released only *after* it. While a flush
is being written, lookups still see what it holds (it is set aside, not dropped), and new
changes go to a fresh cache.

Keys (big-endian, so one ledger's entries are one ordered range)::

    b"E" ledger u64 entry u64 -> location i64      an entry's place in the entry logs
    b"L" ledger u64           -> a LedgerRecord    master key, fenced, limbo, LAC, max entry
    b"M"                      -> mark i64          the journal LSN the index covers

Memory is the write cache (bounded: ``cache_bytes`` reaching ``max_cache_bytes`` tells the
caller to checkpoint now) plus the engine's own caches, whatever the index holds on disk.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from aiobk.bookie.index_db import IndexBatch, IndexDb

LOCATION_KEY = struct.Struct(">cQQ")
STATE_KEY = struct.Struct(">cQ")
VALUE = struct.Struct(">q")
STATE_HEAD = struct.Struct(">BqqB")  # flags, lac, max entry, key length
MARK_KEY = b"M"
FENCED, LIMBO = 1, 2
CACHED_BYTES = 80  # what one cached location costs in memory, roughly (dict slot and ints)


def location_key(ledger_id: int, entry_id: int) -> bytes:
    return LOCATION_KEY.pack(b"E", ledger_id, entry_id)


def state_key(ledger_id: int) -> bytes:
    return STATE_KEY.pack(b"L", ledger_id)


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """What the index keeps of a ledger besides its entries."""

    master_key: bytes
    fenced: bool = False
    limbo: bool = False
    lac: int = -1
    max_entry: int = -1

    def encode(self) -> bytes:
        flags = (FENCED if self.fenced else 0) | (LIMBO if self.limbo else 0)
        head = STATE_HEAD.pack(flags, self.lac, self.max_entry, len(self.master_key))
        return head + self.master_key

    @classmethod
    def decode(cls, data: bytes) -> LedgerRecord:
        flags, lac, max_entry, length = STATE_HEAD.unpack_from(data)
        key = data[STATE_HEAD.size : STATE_HEAD.size + length]
        return cls(bytes(key), bool(flags & FENCED), bool(flags & LIMBO), lac, max_entry)


class _Changes:
    """One generation of the write cache."""

    __slots__ = ("deleted", "locations", "states")

    def __init__(self) -> None:
        self.locations: dict[int, dict[int, int]] = {}  # ledger -> entry -> location
        self.states: dict[int, LedgerRecord] = {}
        self.deleted: set[int] = set()


class EntryIndex:
    def __init__(self, db: IndexDb, max_cache_bytes: int = 64 << 20) -> None:
        self.db = db
        self.max_cache_bytes = max_cache_bytes
        self._cache = _Changes()
        self._flushing: _Changes | None = None  # being written: still what lookups see
        self._cached = 0

    # ------------------------------------------------------------------ writing

    def put_location(self, ledger_id: int, entry_id: int, location: int) -> None:
        entries = self._cache.locations.get(ledger_id)
        if entries is None:
            entries = self._cache.locations[ledger_id] = {}
        if entry_id not in entries:
            self._cached += CACHED_BYTES
        entries[entry_id] = location

    def put_state(self, ledger_id: int, record: LedgerRecord) -> None:
        self._cache.states[ledger_id] = record

    def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger: its entries and state go with the next flush."""
        cache = self._cache
        self._cached -= CACHED_BYTES * len(cache.locations.pop(ledger_id, {}))
        cache.states.pop(ledger_id, None)
        cache.deleted.add(ledger_id)

    @property
    def cache_bytes(self) -> int:
        return self._cached

    @property
    def full(self) -> bool:
        """The write cache reached its bound: checkpoint now."""
        return self._cached >= self.max_cache_bytes

    async def flush(self, mark: int) -> None:
        """Write every change so far and ``mark`` (the journal LSN covered) in one durable
        batch. Entry-log bytes the changes name must be synced already (see the docstring)."""
        changes, self._cache = self._cache, _Changes()
        self._cached = 0
        self._flushing = changes
        batch = IndexBatch()
        for ledger_id in sorted(changes.deleted):
            batch.delete_range(location_key(ledger_id, 0), location_key(ledger_id + 1, 0))
            batch.delete(state_key(ledger_id))
        for ledger_id, entries in changes.locations.items():
            for entry_id, location in entries.items():
                batch.put(location_key(ledger_id, entry_id), VALUE.pack(location))
        for ledger_id, record in changes.states.items():
            batch.put(state_key(ledger_id), record.encode())
        batch.put(MARK_KEY, VALUE.pack(mark))
        try:
            await self.db.write(batch)
        except BaseException:
            self._merge_back(changes)
            raise
        finally:
            self._flushing = None

    def _merge_back(self, failed: _Changes) -> None:
        """A failed flush: its changes stay cached (older than what came meanwhile)."""
        newer = self._cache
        for ledger_id, entries in failed.locations.items():
            if ledger_id in newer.deleted:
                continue
            merged = {**entries, **newer.locations.get(ledger_id, {})}
            newer.locations[ledger_id] = merged
        for ledger_id, record in failed.states.items():
            if ledger_id not in newer.deleted:
                newer.states.setdefault(ledger_id, record)
        newer.deleted |= failed.deleted - set(newer.locations) - set(newer.states)
        self._cached = CACHED_BYTES * sum(len(e) for e in newer.locations.values())

    # ------------------------------------------------------------------ reading

    def _generations(self) -> list[_Changes]:
        """Newest first: the cache, then a flush being written."""
        if self._flushing is None:
            return [self._cache]
        return [self._cache, self._flushing]

    def location(self, ledger_id: int, entry_id: int) -> int:
        """Where the entry is, or -1."""
        for changes in self._generations():
            entries = changes.locations.get(ledger_id)
            if entries is not None and entry_id in entries:
                return entries[entry_id]
            if ledger_id in changes.deleted:
                return -1
        found = self.db.get(location_key(ledger_id, entry_id))
        return -1 if found is None else VALUE.unpack(found)[0]

    def state(self, ledger_id: int) -> LedgerRecord | None:
        for changes in self._generations():
            record = changes.states.get(ledger_id)
            if record is not None:
                return record
            if ledger_id in changes.deleted:
                return None
        found = self.db.get(state_key(ledger_id))
        return None if found is None else LedgerRecord.decode(found)

    def entries(self, ledger_id: int) -> Iterator[tuple[int, int]]:
        """(entry, location) of every entry the ledger has, ascending."""
        merged: dict[int, int] = {}
        generations = self._generations()
        if not any(ledger_id in g.deleted for g in generations):
            start, end = location_key(ledger_id, 0), location_key(ledger_id + 1, 0)
            for key, value in self.db.scan(start, end):
                merged[LOCATION_KEY.unpack(key)[2]] = VALUE.unpack(value)[0]
        for changes in reversed(generations):  # oldest first, newer overwrite
            if ledger_id in changes.deleted:
                merged = {}
            merged.update(changes.locations.get(ledger_id, {}))
        return iter(sorted(merged.items()))

    def ledgers(self) -> Iterator[int]:
        """Every ledger with a state, ascending (flushed and cached)."""
        found = {STATE_KEY.unpack(k)[1] for k, _v in self.db.scan(b"L", b"M")}
        for changes in reversed(self._generations()):
            found -= changes.deleted
            found |= set(changes.states)
        return iter(sorted(found))

    def mark(self) -> int:
        """The journal LSN the flushed index covers (-1: never flushed)."""
        found = self.db.get(MARK_KEY)
        return -1 if found is None else VALUE.unpack(found)[0]


__all__ = ["EntryIndex", "LedgerRecord", "location_key", "state_key"]
