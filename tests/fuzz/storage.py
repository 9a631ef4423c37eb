"""atheris target: the storage encoders and decoders (index segments, journal records, entry-log
records), both ways.

1. Values the protocol lets a peer send (``protocol.limits``: ledger and entry ids, 32-byte or
   empty keys, any int64 LAC) and whatever GC drops make ledger states; encoding them must
   not fail -- an encoder that raises after an add was acknowledged stops every checkpoint
   and every restart -- and decoding must give them back.
2. Arbitrary bytes under a valid checksum through the index decoder, and arbitrary records
   through the journal scanner and the entry-log record check: refused with their typed
   errors, never another exception.

    python -m tests.fuzz.storage -runs=200000          # make fuzz
"""

from __future__ import annotations

import contextlib
import sys

import atheris

with atheris.instrument_imports():
    import crc32c

    from aiobk.bookie.entrylog.format import CorruptEntryError, check_record
    from aiobk.bookie.journal.format import RecordType, encode_record, scan
    from aiobk.bookie.stats import BookieStats
    from aiobk.bookie.upgrade.segments import (
        CRC,
        HEADER,
        MAGIC,
        IndexCorruptError,
        Loaded,
        decode_segment,
        encode_segment,
    )
    from aiobk.bookie.upgrade.segments import PagedLedger as LedgerState
    from aiobk.protocol import MASTER_KEY_SIZE, MAX_ENTRY_ID, MAX_LEDGER_ID

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
STATS = BookieStats()


def _states(fdp: atheris.FuzzedDataProvider) -> list[LedgerState]:
    states: dict[int, LedgerState] = {}
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        ledger_id = fdp.ConsumeIntInRange(0, MAX_LEDGER_ID)
        key = fdp.ConsumeBytes(MASTER_KEY_SIZE) if fdp.ConsumeBool() else b""
        state = LedgerState(ledger_id, key)
        for _entry in range(fdp.ConsumeIntInRange(0, 300)):
            if fdp.ConsumeBool():  # near the last one: pages fill up and turn dense
                entry_id = min(MAX_ENTRY_ID, max(0, state.max_entry) + fdp.ConsumeIntInRange(0, 3))
            else:
                entry_id = fdp.ConsumeIntInRange(0, MAX_ENTRY_ID)
            state.set_location(entry_id, fdp.ConsumeIntInRange(0, INT64_MAX))
        state.lac = fdp.ConsumeIntInRange(INT64_MIN, INT64_MAX)
        state.fenced, state.limbo = fdp.ConsumeBool(), fdp.ConsumeBool()
        states[ledger_id] = state
    return list(states.values())


def _round_trip(fdp: atheris.FuzzedDataProvider) -> None:
    states = _states(fdp)
    deleted = {fdp.ConsumeIntInRange(0, MAX_LEDGER_ID) for _ in range(fdp.ConsumeIntInRange(0, 4))}
    mark = fdp.ConsumeIntInRange(INT64_MIN, INT64_MAX)
    expected = {
        s.ledger_id: (s.master_key, s.fenced, s.limbo, s.lac, s.max_entry, dict(_entries(s)))
        for s in states
    }
    data, _count = encode_segment(fdp.ConsumeIntInRange(0, 2**64 - 1), True, mark, states, deleted)
    loaded = Loaded()
    decode_segment(data, loaded)
    got = {
        s.ledger_id: (s.master_key, s.fenced, s.limbo, s.lac, s.max_entry, dict(_entries(s)))
        for s in loaded.ledgers.values()
    }
    if got != expected or loaded.deleted != deleted or loaded.mark != mark:
        raise AssertionError("an index segment did not read back what was written")


def _entries(state: LedgerState) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for number, page in state.pages.items():
        items = page.items() if isinstance(page, dict) else enumerate(page)
        out.extend(((number << 12) + slot, loc) for slot, loc in items if loc >= 0)
    return out


def _garbage(fdp: atheris.FuzzedDataProvider) -> None:
    # A valid header and checksum around anything: the decoder must read no further than
    # the bytes it has, and refuse with IndexCorruptError.
    version, kind = fdp.ConsumeIntInRange(1, 2), fdp.ConsumeIntInRange(1, 2)
    count = fdp.ConsumeIntInRange(0, 3)
    data = fdp.ConsumeBytes(fdp.remaining_bytes())
    for body in (HEADER.pack(MAGIC, version, kind, 1, 5, count) + data, data):
        with contextlib.suppress(IndexCorruptError):
            decode_segment(body + CRC.pack(crc32c.crc32c(body)), Loaded())
    with contextlib.suppress(CorruptEntryError):
        check_record(data, 1, 0, 1, 1, STATS)
    records, _stop, _why = scan(data)
    for record in records:
        _same_record(record.kind, record.lsn, record.payload)


def _same_record(kind: RecordType, lsn: int, payload: bytes) -> None:
    records, _stop, _why = scan(encode_record(kind, lsn, payload))
    if [(r.kind, r.lsn, r.payload) for r in records] != [(kind, lsn, payload)]:
        raise AssertionError("a journal record did not read back what was written")


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        _round_trip(fdp)
    else:
        kind = RecordType(fdp.ConsumeIntInRange(1, 5))
        payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
        lsn = fdp.ConsumeIntInRange(0, 2**64 - 1)
        _same_record(kind, lsn, payload)
        _garbage(fdp)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
