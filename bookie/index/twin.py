"""``LogIndexDb``: the index engine's twin, for the deterministic simulator (bookie.index.engine).

Every batch is one record appended to ``index.log`` through the bookie's ``Disk`` seam and
synced before ``write`` returns: ``[u32 length][u32 crc32c][msgpack ops]``. Opening replays the
records into a sorted in-memory map and stops at the first record that is torn or fails its
checksum -- what a crash in the middle of an append leaves -- truncating it away, so a crash
keeps exactly the batches that were synced, each whole. On a simulated disk that is what the
simulator's crash model decides; on a real one it is what the kernel kept.

Everything is held in memory and the log is never compacted: this is the simulator's engine
(small ledger counts, crash semantics that matter), not the production one (``RocksIndexDb``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import struct
from collections.abc import Iterator
from typing import cast

import crc32c
import msgpack

from aiobk.bookie.disk import AppendFile, Disk
from aiobk.bookie.index.engine import DELETE, PUT, IndexBatch, IndexDb

HEAD = struct.Struct(">II")  # payload length, crc32c of the payload
FILE = "index.log"


class LogIndexDb(IndexDb):
    def __init__(self, disk: Disk, path: str) -> None:
        self._disk = disk
        self._file = os.path.join(path, FILE)
        self._dir = path
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []  # sorted
        self._handle: AppendFile | None = None
        self._good = 0  # where the last whole, synced batch ends
        self._lock = asyncio.Lock()  # batches reach the log and the map in one order

    @classmethod
    async def open(cls, disk: Disk, path: str) -> LogIndexDb:
        db = cls(disk, path)
        await disk.makedirs(path)
        good = 0
        if await disk.exists(db._file):
            data = await disk.read_file(db._file)
            good = db._replay(data)
            if good < len(data):
                await disk.truncate(db._file, good)  # a torn last batch: never synced whole
        db._good = good
        return db  # the log is opened for appends by the first write (a full disk may boot)

    def _replay(self, data: bytes) -> int:
        """Apply every whole record; return where the good ones end."""
        offset = 0
        while offset + HEAD.size <= len(data):
            length, crc = HEAD.unpack_from(data, offset)
            payload = data[offset + HEAD.size : offset + HEAD.size + length]
            if len(payload) < length or crc32c.crc32c(payload) != crc:
                break
            self._apply([(op, bytes(k), bytes(v)) for op, k, v in msgpack.unpackb(payload)])
            offset += HEAD.size + length
        return offset

    def _apply(self, ops: list[tuple[int, bytes, bytes]]) -> None:
        data, keys = self._data, self._keys
        for op, key, value in ops:
            if op == PUT:
                if key not in data:
                    bisect.insort(keys, key)
                data[key] = value
            elif op == DELETE:
                if data.pop(key, None) is not None:
                    del keys[bisect.bisect_left(keys, key)]
            else:
                lo, hi = bisect.bisect_left(keys, key), bisect.bisect_left(keys, value)
                for gone in keys[lo:hi]:
                    del data[gone]
                del keys[lo:hi]

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        keys = self._keys
        index = bisect.bisect_left(keys, start)
        while index < len(keys) and keys[index] < end:
            key = keys[index]
            yield key, self._data[key]
            index = bisect.bisect_right(keys, key)  # the map may change between yields

    async def write(self, batch: IndexBatch) -> None:
        payload = msgpack.packb(batch.ops, use_bin_type=True)
        record = HEAD.pack(len(payload), crc32c.crc32c(payload)) + payload
        async with self._lock:
            if self._handle is None:
                self._handle = await self._disk.open_append(self._file, "index")
            try:
                await self._handle.write_and_sync(record)
            except BaseException:
                await self._undo()
                raise
            self._good += len(record)
            self._apply(batch.ops)

    async def _undo(self) -> None:
        """After a failed write (a full disk may take part of it), cut the log back to its last
        whole batch, so the next batch is not appended behind a torn one."""
        handle, self._handle = self._handle, None
        with contextlib.suppress(Exception):
            if handle is not None:
                await handle.close()
            await self._disk.truncate(self._file, self._good)

    async def close(self) -> None:
        if self._handle is not None:
            await self._handle.close()
            self._handle = None


__all__ = ["LogIndexDb"]


class TwinIndex:
    """Mixin for a ``Disk`` whose index must go through it (the simulator's, fault injectors):
    the twin, on this disk, instead of RocksDB writing real files behind the seam's back."""

    async def open_index(self, path: str, *, cache_bytes: int, write_buffer: int) -> IndexDb:
        return await LogIndexDb.open(cast(Disk, self), path)
