"""Reading the entry logs: one entry at a location (from the write buffer while its bytes are
not in the file yet), a run of one ledger's entries (a range read: neighbours in a log are
read with one ``pread``), and walks over a whole log's records -- compaction's, and the one
that counts a log whose counts were never kept. Owns the read handles of the log files."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Sequence

from aiobk.bookie import record_codecs
from aiobk.bookie.disk import Disk, ReadFile
from aiobk.bookie.entrylog.buffer import LogBuffer
from aiobk.bookie.entrylog.format import (
    FILE_MAGIC,
    IDS,
    MAX_RECORD,
    PAGE,
    READ_MIN,
    RECORD_HEAD,
    SCAN_BLOCK,
    CorruptEntryError,
    check_record,
    log_name,
    unpack_location,
)
from aiobk.bookie.stats import BookieStats

log = logging.getLogger(__name__)

# The file bytes one ``pread`` of a range read may span: neighbouring records of the ledger and
# whatever other ledgers' records lie between them (read and passed over).
RUN_SPAN = 1 << 20


class EntryReader:
    def __init__(self, disk: Disk, directory: str, buffer: LogBuffer, stats: BookieStats) -> None:
        self._disk = disk
        self._dir = directory
        self._buffer = buffer
        self.stats = stats
        self._readers: dict[int, ReadFile] = {}

    async def read(self, location: int, ledger_id: int, entry_id: int) -> bytes:
        """The body stored at ``location``, checked against its CRC and expected ids."""
        log_id, offset = unpack_location(location)
        view = self._buffer.buffered(log_id, offset)
        if view is not None:
            head = bytes(view[: RECORD_HEAD.size])
            length = RECORD_HEAD.unpack_from(head)[0]
            record = bytes(view[: 8 + length])
        else:
            reader = await self.reader(log_id)
            guess = PAGE - offset % PAGE
            record = await reader.pread(offset, guess if guess >= READ_MIN else guess + PAGE)
            if len(record) < RECORD_HEAD.size:
                raise CorruptEntryError(f"entry log {log_id:x} is truncated at {offset}")
            size = 8 + RECORD_HEAD.unpack_from(record)[0]
            if size > MAX_RECORD:
                self.stats.corrupt_reads += 1
                raise CorruptEntryError(f"entry log {log_id:x}: a record of {size} B at {offset}")
            if size > len(record):  # a big entry: the rest of it
                record += await reader.pread(offset + len(record), size - len(record))
            else:
                record = record[:size]
        return check_record(record, log_id, offset, ledger_id, entry_id, self.stats)

    async def read_many(
        self, ledger_id: int, wanted: Sequence[tuple[int, int]], max_bytes: int
    ) -> list[bytes]:
        """The bodies of ``wanted`` -- (entry id, location) of one ledger's entries, in entry
        order -- each checked as ``read`` checks it, for as long as their bodies stay within
        ``max_bytes`` (the first always read). Records of one log within ``RUN_SPAN`` of each
        other and out of the write buffer are read with one ``pread``. A damaged first record
        raises ``CorruptEntryError``; a damaged later one ends the run before it (its reader
        asks for it again, and hears EIO then)."""
        bodies: list[bytes] = []
        total = 0
        at = 0
        while at < len(wanted):
            end = self._run_end(wanted, at)
            try:
                if end == at + 1:
                    entry_id, location = wanted[at]
                    run = [await self.read(location, ledger_id, entry_id)]
                else:
                    run = await self._read_run(ledger_id, wanted[at:end])
            except CorruptEntryError:
                if not bodies:
                    raise
                return bodies
            for body in run:
                if bodies and total + len(body) > max_bytes:
                    return bodies
                bodies.append(body)
                total += len(body)
            if len(run) < end - at:
                return bodies  # a damaged record ended the run
            at = end
        return bodies

    def _run_end(self, wanted: Sequence[tuple[int, int]], at: int) -> int:
        """Where the run starting at ``wanted[at]`` ends: its records lie in one log, in file
        order, within ``RUN_SPAN``, none in the write buffer (which holds a log's tail: every
        offset from its first buffered one)."""
        log_id, start = unpack_location(wanted[at][1])
        buffered = self._buffer.first_buffered(log_id)
        if buffered is not None and start >= buffered:
            return at + 1
        limit = start + RUN_SPAN if buffered is None else min(start + RUN_SPAN, buffered)
        return record_codecs.run_end(wanted, at, limit)

    async def _read_run(self, ledger_id: int, run: Sequence[tuple[int, int]]) -> list[bytes]:
        """Bodies of a run (``_run_end``), read with one ``pread`` (two when the last record
        reaches past a page); stops before a damaged record that is not the first."""
        log_id, start = unpack_location(run[0][1])
        last = unpack_location(run[-1][1])[1]
        reader = await self.reader(log_id)
        block = await reader.pread(start, last - start + PAGE)
        whole = record_codecs.check_records(block, start, ledger_id, run)
        if whole is not None:  # every record in the block and sound: the common case
            return whole
        bodies: list[bytes] = []
        for entry_id, location in run:
            at = unpack_location(location)[1] - start
            whole_head = at + RECORD_HEAD.size <= len(block)  # else a file cut short: damaged
            end = at + 8 + RECORD_HEAD.unpack_from(block, at)[0] if whole_head else len(block)
            if end - at > MAX_RECORD:  # a damaged length: nothing to read
                end = len(block)
            if end > len(block):  # the last record reaches past the page read with it
                block += await reader.pread(start + len(block), end - len(block))
            try:
                bodies.append(
                    check_record(block[at:end], log_id, start + at, ledger_id, entry_id, self.stats)
                )
            except CorruptEntryError:
                if not bodies:
                    raise
                break
        return bodies

    async def reader(self, log_id: int) -> ReadFile:
        reader = self._readers.get(log_id)
        if reader is None:
            path = os.path.join(self._dir, log_name(log_id))
            try:
                reader = await self._disk.open_read(path)
            except FileNotFoundError:
                raise CorruptEntryError(f"entry log {log_id:x} is missing") from None
            self._readers[log_id] = reader
        return reader

    def forget(self, log_id: int) -> ReadFile | None:
        """Stop keeping the read handle of ``log_id`` (its file goes away); return it."""
        return self._readers.pop(log_id, None)

    async def scan(self, log_id: int) -> tuple[int, dict[int, int]]:
        """Count the records of a log, and their bytes per ledger, by walking their heads a
        block at a time; a torn tail (a crash mid-write) ends the walk."""
        reader = await self.reader(log_id)
        size = await reader.size()
        offset, count = len(FILE_MAGIC), 0
        sizes: dict[int, int] = {}
        block, block_start = b"", offset
        while offset + RECORD_HEAD.size <= size:
            at = offset - block_start
            if at + RECORD_HEAD.size > len(block):
                block, block_start, at = await reader.pread(offset, SCAN_BLOCK), offset, 0
                if len(block) < RECORD_HEAD.size:
                    break
            length, _crc, ledger_id, _entry_id = RECORD_HEAD.unpack_from(block, at)
            end = offset + 8 + length
            if length < IDS.size or end > size:
                break
            count += 1
            sizes[ledger_id] = sizes.get(ledger_id, 0) + 8 + length
            offset = end
        return count, sizes

    async def records(self, log_id: int) -> AsyncIterator[tuple[int, int, int, bytes]]:
        """(offset, ledger, entry, body) of every record of a complete log, in file order, a
        block at a time (compaction's walk, BookKeeper's scanEntryLog). A record failing its
        checksum is skipped with a warning; a torn tail ends the walk."""
        self._buffer.check_complete(log_id)
        reader = await self.reader(log_id)
        size = await reader.size()
        offset = len(FILE_MAGIC)
        block, block_start = b"", offset
        while offset + RECORD_HEAD.size <= size:
            at = offset - block_start
            if at + RECORD_HEAD.size > len(block):
                block, block_start, at = await reader.pread(offset, SCAN_BLOCK), offset, 0
            length, _crc, ledger_id, entry_id = RECORD_HEAD.unpack_from(block, at)
            end = offset + 8 + length
            if length < IDS.size or end > size:
                return
            if at + 8 + length > len(block):
                want = max(SCAN_BLOCK, 8 + length)
                block, block_start, at = await reader.pread(offset, want), offset, 0
            record = block[at : at + 8 + length]
            try:
                body = check_record(record, log_id, offset, ledger_id, entry_id, self.stats)
            except CorruptEntryError as exc:
                log.warning("%s; skipped", exc)
            else:
                yield offset, ledger_id, entry_id, body
            offset = end

    async def close(self) -> None:
        for reader in self._readers.values():
            await reader.close()
        self._readers.clear()
