"""The journal's files: which exist (first LSN and path, oldest first), the one being written,
when it rolls over to a new one, and which a checkpoint lets go. Replay walks these same files,
so the list it finds is where writing goes on. Only the writer stage holds the current file;
keeping the files apart leaves it with nothing but batches to write."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from aiobk.bookie.disk import AppendFile, Disk
from aiobk.bookie.journal.format import FILE_HEADER, Record, encode_file_header
from aiobk.bookie.journal.replay import file_name, replay

PREALLOCATE = 4 * 1024 * 1024  # zero-filled ahead: fdatasyncs of overwrites commit no metadata


class JournalFiles:
    def __init__(self, disk: Disk, directory: str, max_file_size: int) -> None:
        self._disk = disk
        self._dir = directory
        self.max_file_size = max_file_size
        self._files: list[tuple[int, str]] = []  # (first LSN, path), oldest first
        self._closed_at: tuple[int, int] | None = None  # the last closed file's position
        self.handle: AppendFile | None = None  # the file being written; None between files

    def position(self) -> tuple[int, int] | None:
        """(the current file's first LSN, the end of what was handed to it): every record
        before that offset was appended before this call, so a checkpoint that takes
        ``last_lsn`` right after covers them, and the next replay may start reading the file
        there instead of at its beginning (BookKeeper's LogMark). After a stop (whose final
        checkpoint takes it), the end of the last file; None before any file was open."""
        handle = self.handle
        if handle is None:
            return self._closed_at  # stopped, or between files: the last one's end
        return self._files[-1][0], handle.size

    @property
    def files(self) -> list[str]:
        return [path for _first, path in self._files]

    async def replay(
        self,
        after_lsn: int,
        apply: Callable[[Record], None],
        start: tuple[int, int] | None,
    ) -> tuple[int, int]:
        """Apply every record with an LSN above ``after_lsn``, in order (``bookie.journal.
        replay``); return how many, and one past the highest LSN known."""
        replayed = await replay(self._disk, self._dir, after_lsn, apply, start)
        self._files = replayed.files
        return replayed.applied, replayed.next_lsn

    async def make_dir(self) -> None:
        await self._disk.makedirs(self._dir)

    async def open(self, first_lsn: int) -> None:
        path = os.path.join(self._dir, file_name(first_lsn))
        if self._files and self._files[-1][0] == first_lsn:
            # A previous boot created this file and crashed before any record reached it.
            self._files.pop()
            await self._disk.remove(path)
        elif await self._disk.exists(path):
            await self._disk.remove(path)
        handle = await self._disk.open_append(
            path, "journal", sync_lane="journal-sync", preallocate=PREALLOCATE
        )
        await handle.write_and_sync(encode_file_header(first_lsn))
        self.handle = handle
        self._files.append((first_lsn, path))

    async def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            self._closed_at = (self._files[-1][0], handle.size)
            await handle.close()

    async def file_for(
        self, size: int, first_lsn: int | None, before_roll: Callable[[], Awaitable[None]]
    ) -> AppendFile:
        """The journal file for the next write, rolled over when it would grow too big, once
        ``before_roll`` returns (it raises to stay on this file)."""
        handle = self.handle
        assert handle is not None
        if (
            first_lsn is not None
            and handle.size > FILE_HEADER.size
            and handle.size + size > self.max_file_size
        ):
            await before_roll()
            await self.close()
            await self.open(first_lsn)
            handle = self.handle
            assert handle is not None
        return handle

    async def release(self, upto_lsn: int) -> int:
        """Delete journal files whose every record is at or below ``upto_lsn``; return count."""
        removed = 0
        while len(self._files) > 1 and self._files[1][0] <= upto_lsn + 1:
            _first, path = self._files.pop(0)
            await self._disk.remove(path)
            removed += 1
        return removed
