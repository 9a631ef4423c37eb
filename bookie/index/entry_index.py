"""Entry locations and ledger state on the on-disk index, with a write cache (after
BookKeeper's DbLedgerStorage: EntryLocationIndex, LedgerMetadataIndex and its WriteCache).

Theory of operation. What changed since the last checkpoint -- new entry locations, ledger
states, deleted ledgers -- waits in memory (the write cache); everything older is in the
``IndexDb`` (RocksDB in production, its twin in the simulator). A checkpoint ``seal``s the cache
(synchronously, at the journal LSN it covers), syncs the entry logs, then ``commit``s the sealed
changes as one atomic, durable batch together with that LSN; so after a crash the index is
exactly as of some checkpoint and the journal after that LSN replays the rest.

The caller keeps the order that makes this safe (bookie.storage): entry-log bytes are synced
*before* the commit that names them, and the journal is released only *after* it. While sealed
changes are being written, lookups still see them (set aside, not dropped), and new changes go
to a fresh cache; a commit that fails merges its changes back under the newer ones.

Keys (big-endian, so one ledger's entries, or one entry log's ledgers, are one ordered range)::

    b"E" ledger u64           -> a LedgerRecord    master key, fenced, limbo, LAC, max entry
    b"E" ledger u64 entry u64 -> location i64      an entry's place in the entry logs
    b"H" ledger u64           -> b""               held: the ledgers, for iterating them
    b"D" ledger u64           -> b""               garbage collected: never to come back
    b"G" log u64 ledger u64   -> count i64         entries appended to that log for the ledger
    b"M"                      -> mark i64          the journal LSN the index covers
    b"N"                      -> count i64         ledgers held (a gauge, kept with the mark)
    b"J"                      -> file u64 offset u64  where replay may start reading the journal
    b"V"                      -> layout u8         this key layout (``LAYOUT``)

A ledger's record sorts just before its entries, so a read that loads the record and then
looks up an entry of a small ledger finds both in one block: one block read from a cold disk,
not two (a read answers with the ledger's LAC, so it needs the record). Deleting a ledger is
one range delete over both.

The ``G`` keys are what garbage collection needs without reading every location (BookKeeper
keeps the same per-log ledger map, EntryLogMetadata): an entry log can go once every ledger it
names is deleted, and its live share is the sum of the counts of the ledgers still held.

Memory is the write cache (``WriteCache``, bounded: ``full`` tells the caller to checkpoint
now) plus the engine's own caches, whatever the index holds on disk.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from aiobk.bookie.index.engine import PUT, IndexBatch, IndexCorruptError, IndexDb

LOCATION_KEY = struct.Struct(">cQQ")
STATE_KEY = struct.Struct(">cQ")
LAYOUT = 2  # 1: records under their own b"L" prefix (never released)
LAYOUT_KEY = b"V"
LOG_KEY = struct.Struct(">cQQ")
VALUE = struct.Struct(">q")
STATE_HEAD = struct.Struct(">BqqB")  # flags, lac, max entry, key length
MARK_KEY = b"M"
HELD_KEY = b"N"
START_KEY = b"J"
START = struct.Struct(">QQ")
FENCED, LIMBO = 1, 2
LOG_SHIFT = 40  # a location is log << 40 | offset (bookie.entrylog)
CACHED_BYTES = 80  # what one cached location costs in memory, roughly (dict slot and ints)


def location_key(ledger_id: int, entry_id: int) -> bytes:
    return LOCATION_KEY.pack(b"E", ledger_id, entry_id)


def state_key(ledger_id: int) -> bytes:
    return STATE_KEY.pack(b"E", ledger_id)


def held_key(ledger_id: int) -> bytes:
    return STATE_KEY.pack(b"H", ledger_id)


def ledger_range(ledger_id: int) -> tuple[bytes, bytes]:
    """[start, end) of the ledger's record and entries."""
    return state_key(ledger_id), state_key(ledger_id + 1)


def put_record(batch: IndexBatch, ledger_id: int, record: LedgerRecord) -> None:
    batch.put(state_key(ledger_id), record.encode())
    batch.put(held_key(ledger_id), b"")


def put_mark(batch: IndexBatch, mark: int) -> None:
    """The journal LSN the index covers, with the key layout it is written in."""
    batch.put(LAYOUT_KEY, bytes([LAYOUT]))
    batch.put(MARK_KEY, VALUE.pack(mark))


def check_layout(db: IndexDb, path: str) -> None:
    """Refuse an index written in another key layout (IndexCorruptError: the bookie stops)."""
    found = db.get(LAYOUT_KEY)
    layout = found[0] if found else (1 if db.get(MARK_KEY) is not None else LAYOUT)
    if layout != LAYOUT:
        raise IndexCorruptError(
            f"{path}: index key layout {layout}; this bookie reads layout {LAYOUT}"
        )


def deleted_key(ledger_id: int) -> bytes:
    return STATE_KEY.pack(b"D", ledger_id)


def log_key(log_id: int, ledger_id: int) -> bytes:
    return LOG_KEY.pack(b"G", log_id, ledger_id)


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

    __slots__ = ("deleted", "dropped_logs", "held", "locations", "log_counts", "mark", "states")

    def __init__(self) -> None:
        self.locations: dict[int, dict[int, int]] = {}  # ledger -> entry -> location
        self.states: dict[int, LedgerRecord] = {}
        self.deleted: set[int] = set()
        self.log_counts: dict[tuple[int, int], int] = {}  # (log, ledger) -> entries appended
        self.dropped_logs: set[int] = set()
        self.mark = -1
        self.held: int | None = None


class Sealed:
    """Changes a checkpoint took out of the write cache; written by ``EntryIndex.commit``."""

    __slots__ = ("batch", "changes")

    def __init__(self, changes: _Changes, batch: IndexBatch) -> None:
        self.changes = changes
        self.batch = batch


class WriteCache:
    """What changed since the last checkpoint, in memory (BookKeeper's WriteCache): the
    changes gathered now and, while a checkpoint writes them, the generation it sealed, which
    lookups still see (``generations``). Bounded: ``full`` tells the caller to checkpoint."""

    def __init__(self, max_cache_bytes: int) -> None:
        self.max_cache_bytes = max_cache_bytes
        self._cache = _Changes()
        self._flushing: _Changes | None = None  # being written: still what lookups see
        self._cached = 0

    def put_location(self, ledger_id: int, entry_id: int, location: int) -> None:
        """A new place for the entry: appended (add, copy, replay) or moved (compaction)."""
        cache = self._cache
        entries = cache.locations.get(ledger_id)
        if entries is None:
            entries = cache.locations[ledger_id] = {}
        if entry_id not in entries:
            self._cached += CACHED_BYTES
        entries[entry_id] = location
        pair = (location >> LOG_SHIFT, ledger_id)
        counts = cache.log_counts
        counts[pair] = counts.get(pair, 0) + 1

    def put_locations(
        self, ledger_id: int, entry_ids: Sequence[int], locations: Sequence[int]
    ) -> None:
        """``put_location`` of each entry of one ledger (an ADD_BATCH's), at one call's cost.
        ``locations`` are in file order, as a batch's records are appended: when the first and
        the last are in one entry log, so is every one between."""
        if not locations:
            return
        cache = self._cache
        entries = cache.locations.get(ledger_id)
        if entries is None:
            entries = cache.locations[ledger_id] = {}
        before = len(entries)
        entries.update(zip(entry_ids, locations, strict=True))
        counts = cache.log_counts
        log_id = locations[0] >> LOG_SHIFT
        if log_id == locations[-1] >> LOG_SHIFT:
            pair = (log_id, ledger_id)
            counts[pair] = counts.get(pair, 0) + len(locations)
        else:  # the batch rolled to a new log part way
            for location in locations:
                pair = (location >> LOG_SHIFT, ledger_id)
                counts[pair] = counts.get(pair, 0) + 1
        self._cached += CACHED_BYTES * (len(entries) - before)

    def put_state(self, ledger_id: int, record: LedgerRecord) -> None:
        self._cache.states[ledger_id] = record

    def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger for good: its entries and state go with the next commit, and a
        tombstone stays (ids are never reused; a late request must not bring it back)."""
        cache = self._cache
        self._cached -= CACHED_BYTES * len(cache.locations.pop(ledger_id, {}))
        cache.states.pop(ledger_id, None)
        cache.deleted.add(ledger_id)

    def set_held(self, count: int) -> None:
        """How many ledgers the bookie holds, written with the next commit."""
        self._cache.held = count

    def drop_log(self, log_id: int) -> None:
        """An entry log was removed: forget which ledgers it held."""
        self._cache.dropped_logs.add(log_id)

    @property
    def memory(self) -> int:
        """Bytes the cached locations cost, roughly (``CACHED_BYTES`` each)."""
        return self._cached

    @property
    def full(self) -> bool:
        """The write cache reached its bound: checkpoint now."""
        return self._cached >= self.max_cache_bytes

    def take(self, mark: int) -> _Changes:
        """Every change so far, as of ``mark``, out of the cache into the generation being
        written; lookups keep seeing it until ``written`` or ``abandon``."""
        assert self._flushing is None, "one checkpoint at a time"
        changes, self._cache = self._cache, _Changes()
        changes.mark = mark
        self._cached = 0
        self._flushing = changes
        return changes

    def written(self) -> None:
        """The generation being written is in the engine now."""
        self._flushing = None

    def abandon(self, changes: _Changes) -> None:
        """``changes`` will not be written now: back into the cache (under newer ones)."""
        if self._flushing is changes:
            self._flushing = None
            self._merge_back(changes)

    def _merge_back(self, failed: _Changes) -> None:
        newer = self._cache
        for ledger_id, entries in failed.locations.items():
            if ledger_id in newer.deleted:
                continue
            newer.locations[ledger_id] = {**entries, **newer.locations.get(ledger_id, {})}
        for ledger_id, record in failed.states.items():
            if ledger_id not in newer.deleted:
                newer.states.setdefault(ledger_id, record)
        for pair, count in failed.log_counts.items():
            newer.log_counts[pair] = newer.log_counts.get(pair, 0) + count
        newer.deleted |= failed.deleted - set(newer.locations) - set(newer.states)
        newer.dropped_logs |= failed.dropped_logs
        if newer.held is None:
            newer.held = failed.held
        self._cached = CACHED_BYTES * sum(len(e) for e in newer.locations.values())

    def generations(self) -> list[_Changes]:
        """Newest first: the cache, then a sealed batch being written."""
        if self._flushing is None:
            return [self._cache]
        return [self._cache, self._flushing]

    def cached_state(self, ledger_id: int) -> LedgerRecord | None:
        for changes in self.generations():
            record = changes.states.get(ledger_id)
            if record is not None or ledger_id in changes.deleted:
                return record
        return None


class EntryIndex:
    """The index: the engine's keys, the write cache in front of them (``cache``: changes go
    there), the checkpoints that move the cache into the engine, and the lookups that read
    both."""

    def __init__(self, db: IndexDb, max_cache_bytes: int = 64 << 20) -> None:
        self.db = db
        self.cache = WriteCache(max_cache_bytes)

    # ------------------------------------------------------------------ checkpoints

    def seal(self, mark: int, start: tuple[int, int] | None = None) -> Sealed:
        """Take every change so far out of the cache, as of ``mark`` (the journal LSN they
        cover), into a batch; lookups keep seeing them until ``commit`` or ``abandon``. Only
        one sealed batch at a time (checkpoints run one after the other). ``start``: where
        the journal's next replay may begin reading (``Journal.position``, taken before the
        mark), kept with it."""
        changes = self.cache.take(mark)
        batch = IndexBatch()
        db = self.db
        for ledger_id in sorted(changes.deleted):
            batch.delete_range(*ledger_range(ledger_id))
            batch.delete(held_key(ledger_id))
            batch.put(deleted_key(ledger_id), b"")
        for log_id in sorted(changes.dropped_logs):
            batch.delete_range(log_key(log_id, 0), log_key(log_id + 1, 0))
        ops, pack_value = batch.ops, VALUE.pack  # ``batch.put`` unrolled: one per entry
        for ledger_id, entries in changes.locations.items():
            ops.extend(
                [(PUT, location_key(ledger_id, e), pack_value(at)) for e, at in entries.items()]
            )
        for (log_id, ledger_id), count in changes.log_counts.items():
            if log_id in changes.dropped_logs:
                continue
            key = log_key(log_id, ledger_id)
            before = db.get(key)
            total = count + (0 if before is None else VALUE.unpack(before)[0])
            batch.put(key, VALUE.pack(total))
        for ledger_id, record in changes.states.items():
            put_record(batch, ledger_id, record)
        if changes.held is not None:
            batch.put(HELD_KEY, VALUE.pack(changes.held))
        if start is not None:
            batch.put(START_KEY, START.pack(*start))
        else:
            batch.delete(START_KEY)  # an older one may name a file this mark has left behind
        put_mark(batch, mark)
        return Sealed(changes, batch)

    async def commit(self, sealed: Sealed) -> None:
        """Write the sealed batch; durable when this returns. Entry-log bytes it names must be
        synced already (see the docstring). On failure its changes return to the cache."""
        try:
            await self.db.write(sealed.batch)
        except BaseException:
            self.abandon(sealed)
            raise
        self.cache.written()

    def abandon(self, sealed: Sealed) -> None:
        """The sealed changes will not be written now: back into the cache (under newer ones)."""
        self.cache.abandon(sealed.changes)

    async def flush(self, mark: int, start: tuple[int, int] | None = None) -> None:
        """``seal`` and ``commit`` in one step (for callers with nothing to sync between)."""
        await self.commit(self.seal(mark, start))

    # ------------------------------------------------------------------ reading

    def location(self, ledger_id: int, entry_id: int) -> int:
        """Where the entry is, or -1."""
        for changes in self.cache.generations():
            entries = changes.locations.get(ledger_id)
            if entries is not None and entry_id in entries:
                return entries[entry_id]
            if ledger_id in changes.deleted:
                return -1
        found = self.db.get(location_key(ledger_id, entry_id))
        return -1 if found is None else VALUE.unpack(found)[0]

    def locations(self, ledger_id: int, first: int, last: int) -> list[int]:
        """Where entries ``first``.. on are, consecutive, ending before the first one not
        held (at most ``last``): a range read's lookups. A ledger the cache knows nothing of
        (a closed one, long checkpointed) is one scan of the engine, not a lookup per entry."""
        generations = self.cache.generations()
        if any(ledger_id in c.locations or ledger_id in c.deleted for c in generations):
            found: list[int] = []
            for entry_id in range(first, last + 1):
                at = self.location(ledger_id, entry_id)
                if at < 0:
                    break
                found.append(at)
            return found
        found = []
        expected = first
        start, end = location_key(ledger_id, first), location_key(ledger_id, last + 1)
        for key, value in self.db.scan(start, end):
            if LOCATION_KEY.unpack(key)[2] != expected:
                break  # an entry missing here: the run ends before it
            found.append(VALUE.unpack(value)[0])
            expected += 1
        return found

    def state(self, ledger_id: int) -> LedgerRecord | None:
        for changes in self.cache.generations():
            record = changes.states.get(ledger_id)
            if record is not None:
                return record
            if ledger_id in changes.deleted:
                return None
        found = self.db.get(state_key(ledger_id))
        return None if found is None else LedgerRecord.decode(found)

    def is_deleted(self, ledger_id: int) -> bool:
        """Garbage collection dropped the ledger (and it must never come back)."""
        if any(ledger_id in changes.deleted for changes in self.cache.generations()):
            return True
        return self.db.get(deleted_key(ledger_id)) is not None

    def entries(self, ledger_id: int) -> Iterator[tuple[int, int]]:
        """(entry, location) of every entry the ledger has, ascending."""
        merged: dict[int, int] = {}
        generations = self.cache.generations()
        if not any(ledger_id in g.deleted for g in generations):
            start, end = location_key(ledger_id, 0), state_key(ledger_id + 1)
            for key, value in self.db.scan(start, end):
                merged[LOCATION_KEY.unpack(key)[2]] = VALUE.unpack(value)[0]
        for changes in reversed(generations):  # oldest first, newer overwrite
            if ledger_id in changes.deleted:
                merged = {}
            merged.update(changes.locations.get(ledger_id, {}))
        return iter(sorted(merged.items()))

    def ledgers(self) -> Iterator[int]:
        """Every ledger with a state, ascending (flushed and cached), streamed from the engine:
        nothing is held per ledger. Ledgers cached after the call starts may be missed."""
        generations = self.cache.generations()
        cached = sorted({i for g in generations for i in g.states})
        gone = {i for g in generations for i in g.deleted} - {
            i for i in cached if self.cache.cached_state(i) is not None
        }
        flushed = (STATE_KEY.unpack(key)[1] for key, _value in self.db.scan(b"H", b"I"))
        last = -1
        for ledger_id in heapq.merge(flushed, iter(cached)):
            if ledger_id == last or ledger_id in gone:
                continue
            last = ledger_id
            yield ledger_id

    def log_ledgers(self, log_id: int) -> Iterator[tuple[int, int]]:
        """(ledger, entries appended) for every ledger an entry log holds, flushed ones only
        (garbage collection checkpoints before it looks)."""
        for key, value in self.db.scan(log_key(log_id, 0), log_key(log_id + 1, 0)):
            yield LOG_KEY.unpack(key)[2], VALUE.unpack(value)[0]

    def pending_log_counts(self) -> dict[int, dict[int, int]]:
        """log -> ledger -> entries appended since the last commit (``log_ledgers`` does not
        count them yet): what a report adds to see the logs as the next checkpoint will."""
        out: dict[int, dict[int, int]] = {}
        for changes in self.cache.generations():
            for (log_id, ledger_id), count in changes.log_counts.items():
                if log_id not in changes.dropped_logs:
                    ledgers = out.setdefault(log_id, {})
                    ledgers[ledger_id] = ledgers.get(ledger_id, 0) + count
        return out

    def held(self) -> int:
        """Ledgers held as of the last commit that counted them (0 before any)."""
        found = self.db.get(HELD_KEY)
        return 0 if found is None else VALUE.unpack(found)[0]

    def mark(self) -> int:
        """The journal LSN the flushed index covers (-1: never flushed)."""
        found = self.db.get(MARK_KEY)
        return -1 if found is None else VALUE.unpack(found)[0]

    def journal_start(self) -> tuple[int, int] | None:
        """Where replay may start reading the journal (a file's first LSN, an offset), as the
        last commit recorded it; None: read every file after the mark from its start."""
        found = self.db.get(START_KEY)
        if found is None:
            return None
        file_lsn, offset = START.unpack(found)
        return file_lsn, offset


__all__ = [
    "LAYOUT",
    "EntryIndex",
    "LedgerRecord",
    "Sealed",
    "WriteCache",
    "check_layout",
    "deleted_key",
    "held_key",
    "ledger_range",
    "location_key",
    "log_key",
    "put_mark",
    "put_record",
    "state_key",
]
