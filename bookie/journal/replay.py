"""Reading the journal back at boot: every record after the last checkpoint, in LSN order.

Files are named after their first LSN (``file_name``). Replay walks them in order and applies
each record above the checkpoint's LSN, proving on the way that none is missing: LSNs are dense
across files (a journal that failed and recovered wrote its stalled records again under their
own LSNs, ``bookie.journal``). A damaged record followed by a valid one is corruption
(``JournalCorruptError``: it may hide acknowledged adds); a damaged or incomplete tail with
nothing valid after it is a torn last write, none of it acknowledged, and is cut off; the
zero-filled, preallocated end of a file is no record at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from aiobk.bookie.disk import Disk
from aiobk.bookie.journal.format import (
    FILE_HEADER,
    JournalCorruptError,
    Record,
    RecordType,
    Stop,
    decode_file_header,
    scan,
    valid_record_after,
)

log = logging.getLogger(__name__)

SUFFIX = ".txn"
READ_CHUNK = 4 * 1024 * 1024


def file_name(first_lsn: int) -> str:
    return f"{first_lsn:016x}{SUFFIX}"


@dataclass(slots=True)
class Replayed:
    applied: int  # records applied
    files: list[tuple[int, str]]  # (first LSN, path) of the files kept, oldest first
    next_lsn: int  # one past the highest LSN known (replayed or checkpointed)


async def list_files(disk: Disk, directory: str) -> list[tuple[int, str]]:
    """(first LSN, path) of every journal file in ``directory``, oldest first."""
    await disk.makedirs(directory)
    found = []
    for name in await disk.listdir(directory):
        stem, suffix = os.path.splitext(name)
        if suffix != SUFFIX or len(stem) != 16:
            continue
        try:
            found.append((int(stem, 16), os.path.join(directory, name)))
        except ValueError:
            continue
    return sorted(found)


class _StartMissed(Exception):
    """The recorded start offset is not where records begin (the file changed since)."""


async def replay(
    disk: Disk,
    directory: str,
    after_lsn: int,
    apply: Callable[[Record], None],
    start: tuple[int, int] | None = None,
) -> Replayed:
    """Apply every record with an LSN above ``after_lsn``, in order.

    ``start`` (a file's first LSN, an offset): where the checkpoint says reading that file may
    begin, every record before it being covered (``Journal.position``). It keeps a restart
    from parsing a whole journal file -- up to ``journal_max_file_size`` of records the
    checkpoint already holds -- to find the few after it. It is only a shortcut: if no record
    begins there, the file is read from its start as without one, and the LSN check below
    still proves nothing is missing."""
    files = await list_files(disk, directory)
    expected = after_lsn + 1
    applied = 0
    kept: list[tuple[int, str]] = []
    for index, (first, path) in enumerate(files):
        is_last = index == len(files) - 1
        next_first = None if is_last else files[index + 1][0]
        if next_first is not None and next_first <= after_lsn + 1:
            kept.append((first, path))  # wholly covered by the checkpoint
            continue
        if first > expected:
            raise JournalCorruptError(
                f"journal records {expected}..{first - 1} are missing before {path}"
            )
        records = None
        if start is not None and start[0] == first and start[1] > FILE_HEADER.size:
            with contextlib.suppress(_StartMissed):
                records = await _read_file(disk, path, first, is_last, start[1])
        if records is None:
            records = await _read_file(disk, path, first, is_last)
        if records is None:  # an empty last file whose header never made it to disk
            await disk.remove(path)
            continue
        kept.append((first, path))
        for record in records:
            if record.kind is RecordType.PADDING or record.lsn <= after_lsn:
                continue
            if record.lsn != expected:
                raise JournalCorruptError(
                    f"journal record {record.lsn} in {path} where {expected} was due"
                )
            apply(record)
            applied += 1
            expected += 1
    return Replayed(applied, kept, expected)


async def _read_file(
    disk: Disk, path: str, first: int, is_last: bool, start: int = FILE_HEADER.size
) -> list[Record] | None:
    """The file's records from ``start`` on (None: an empty last file). From a recorded start
    where no record begins, ``_StartMissed``, and nothing is changed (no tail is cut on a
    guess); once one valid record was read from there, the start was a record boundary and a
    damaged tail is handled as in a whole read."""
    handle = await disk.open_read(path)
    try:
        size = await handle.size()
        header = await handle.pread(0, FILE_HEADER.size)
        try:
            header_lsn = decode_file_header(header)
        except JournalCorruptError:
            if is_last and size <= FILE_HEADER.size:
                return None
            raise
        if header_lsn != first:
            raise JournalCorruptError(f"{path} says it starts at LSN {header_lsn}")
        hinted = start != FILE_HEADER.size
        if hinted and start > size:
            raise _StartMissed
        out: list[Record] = []
        pending = b""
        base = position = start
        while True:
            chunk = await handle.pread(position, READ_CHUNK)
            position += len(chunk)
            at_end = position >= size or not chunk
            data = pending + chunk
            records, stop, why = scan(data)
            out.extend(records)
            if why is Stop.END and not at_end:
                pending, base = b"", base + stop
                continue
            if why is Stop.INCOMPLETE and not at_end:
                pending, base = data[stop:], base + stop
                continue
            if why is not Stop.END:
                rest = data[stop:] + await handle.pread(position, max(0, size - position))
                if not rest.strip(b"\0"):
                    return out  # the unused, zero-filled end of a preallocated file
                if hinted and not out:
                    raise _StartMissed  # no record begins at the recorded start
                later = valid_record_after(rest, 0) if why is Stop.INVALID else None
                if later is not None:
                    raise JournalCorruptError(
                        f"{path}: damaged record at offset {base + stop} is followed by "
                        f"a valid one at {base + stop + later}"
                    )
                log.warning(
                    "journal %s: dropping a torn tail of %d bytes at offset %d",
                    path,
                    size - (base + stop),
                    base + stop,
                )
                await disk.truncate(path, base + stop)
            return out
    finally:
        await handle.close()
