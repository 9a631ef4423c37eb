"""Taking a log as its writer, and appending whole ledgers to it (the Spark sink's commit).

Taking a log (docs/design/logs.md; "The BookKeeper protocol", "Opening a log"): read its ledger
list (creating the log if asked), then fence -- open with recovery -- its last two ledgers: the
previous writer may still be writing to the penultimate one while adding the last. After that a
previous writer can complete no append, and the compare-and-set on the version read -- which
also names the new writer in the log record (``LogMetadata.writer``) -- decides between two
writers that take the log at once. ``LogWriter`` opens a log this way, and so does
``append_ledgers_to_log``: the Spark sink's commit is a writer taking the log, so it fences a
live writer, as any second writer of a single-writer log must.

Positions in a log compare by (ledger id, entry id), and readers (the streaming source among
them) rely on a log's ledgers being in ascending id order. Appended ledgers must therefore come
after the log's last ledger, in ascending order; anything else is refused, never reordered
silently.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence

from aiobk.client.log.format import ENVELOPE, check_format
from aiobk.client.log.ledger_client import LedgerClient
from aiobk.client.log.producers import learn
from aiobk.metadata import LogMetadata
from aiobk.protocol.errors import (
    LogExistsError,
    LogFencedError,
    MetadataVersionError,
    NoSuchLedgerError,
    NoSuchLogError,
)


async def take_log(
    bk: LedgerClient,
    name: str,
    password: bytes,
    *,
    create: bool = True,
    record_format: str | None = None,
) -> LogMetadata:
    """Read (or, with ``create``, create) the log and fence its last two ledgers; the record
    read, whose version a compare-and-set must then match. A log is created with
    ``record_format`` (envelope records when None); a log in another format than a
    ``record_format`` asked for, or in one this client does not know, is ``ValueError``
    before anything is fenced."""
    store = bk.store
    try:
        record = await store.read_log(name)
    except NoSuchLogError:
        if not create:
            raise
        try:
            record = await store.create_log(name, check_format(record_format or ENVELOPE))
        except LogExistsError:
            record = await store.read_log(name)
    check_format(record.record_format)
    if record_format is not None and record.record_format != record_format:
        raise ValueError(
            f"log {name!r} holds {record.record_format} records, not {record_format}: a log's "
            "format is fixed when it is created"
        )
    for ledger_id in record.ledgers[-2:]:
        with contextlib.suppress(NoSuchLedgerError):  # truncated away meanwhile
            await bk.open_ledger(ledger_id, password, recovery=True)
    return record


async def append_ledgers_to_log(
    bk: LedgerClient,
    name: str,
    ledger_ids: Sequence[int],
    password: bytes = b"",
    *,
    record_format: str | None = None,
) -> LogMetadata:
    """Take the log as its writer and append ``ledger_ids`` (closed ledgers, strictly
    ascending) with one compare-and-set, retried on a concurrent change up to the client's
    ``metadata_retries``. Raises ``ValueError`` for ids out of order and ``LogFencedError``
    when the log already holds a ledger at or after the first of them (a writer added one
    meanwhile: appending would break the order of positions). ``record_format``: the format
    the ledgers' entries are in (``take_log``: a new log gets it, another is ValueError)."""
    ids = tuple(ledger_ids)
    if any(later <= earlier for earlier, later in itertools.pairwise(ids)):
        raise ValueError(f"log {name!r}: ledgers to append must be strictly ascending: {ids}")
    store = bk.store
    for _attempt in range(bk.config.metadata_retries):
        record = await take_log(bk, name, password, record_format=record_format)
        if not ids:
            return record
        if record.ledgers and ids[0] <= record.ledgers[-1]:
            raise LogFencedError(
                f"log {name!r}: it ends with ledger {record.ledgers[-1]}, and ledger {ids[0]} "
                "cannot follow it (positions follow ledger order); write them again"
            )
        producers = None
        if record.producers is not None:
            # The appended ledgers hold no producer's records: what the log knows of its
            # producers moves past them, so a producer's next writer reads none of them. A
            # commit sees no producer, so it forgets none either.
            table = await learn(bk, record, password, 2**62)
            producers = table.state(ids[0], 0, None)
        try:
            # Committing ledgers is writing to the log: the sink takes it, as a writer opening
            # would, and a live writer finds itself taken over (docs/design/logs.md).
            return await store.write_log(record.taken((*record.ledgers, *ids), ids[0], producers))
        except MetadataVersionError:
            continue
    raise MetadataVersionError(f"log {name!r}: could not append ledgers {ids}")


__all__ = ["append_ledgers_to_log", "take_log"]
