"""One request must not make a bookie unable to checkpoint or restart.

Before the fix an add at entry id >= 2**44, or an add or fencing read of an unused ledger with a
300-byte master key, was acknowledged; the index encoder then failed on it (a u32 page number,
a u8 key length), checkpoints stopped without a word, SIGTERM exited 1 and every restart failed
replaying the journal. Now every field is checked at the door (``protocol.limits``: EBADREQ,
the connection carries on), what is accepted is what storage holds (u64 page numbers), and a
journal written by the old code replays with the records storage cannot keep left out.
"""

from __future__ import annotations

import pytest

from aiobk.bookie.journal.format import (
    ADD_PREFIX,
    LEDGER_PREFIX,
    RecordType,
    encode_file_header,
    encode_record,
)
from aiobk.bookie.journal.format import add_payload as journal_add_payload
from aiobk.protocol import (
    MAX_ENTRY_ID,
    AddFlag,
    AddRequest,
    ForceRequest,
    ReadFlag,
    ReadLacRequest,
    ReadRequest,
    Request,
    Response,
    StatusCode,
    WriteLacRequest,
)
from tests.hostile.conftest import Connect, Launch
from tests.hostile.harness import BookieUnderTest
from tests.hostile.honest import KEY, add_request, entry_body
from tests.hostile.rawclient import RawConnection
from tests.support.wait import wait_until

INT64_MAX = 2**63 - 1
LONG_KEY = b"k" * 300  # the index kept a u8 key length
FAR_ENTRY = 2**44  # the index kept u32 page numbers (entry id >> 12)
CHECKPOINT_WAIT = 30.0  # seconds: bounded polling for a checkpoint


async def _checkpoints_after(bookie: BookieUnderTest, count: int) -> dict[str, int]:
    """Poll the counters until more than ``count`` checkpoints succeeded (bounded)."""
    seen: list[dict[str, int]] = []

    async def checkpointed() -> bool:
        seen.append(await bookie.stats())
        return seen[-1]["checkpoints"] > count

    await wait_until(
        checkpointed, every=0.1, timeout=CHECKPOINT_WAIT, what=f"checkpoint {count + 1}"
    )
    return seen[-1]


def _poison(conn: RawConnection) -> dict[int, str]:
    """Requests with a field storage cannot hold or the protocol does not define; txn id ->
    what is wrong with it."""
    t = conn.next_txn_id
    unused = 9_000
    cases: list[tuple[Request, str]] = [
        (add_request(t(), 101, INT64_MAX, b"x"), "add at entry 2**63-1"),
        (add_request(t(), unused, 0, b"x", key=LONG_KEY), "add, new ledger, 300-byte key"),
        (
            ReadRequest(t(), unused + 1, -1, ReadFlag.FENCE, LONG_KEY),
            "fencing read, new ledger, 300-byte key",
        ),
        (add_request(t(), -1, 0, b"x"), "add to ledger -1"),
        (add_request(t(), 101, -5, b"x"), "add at entry -5"),
        (add_request(t(), 101, 0, b"x", key=KEY[:31]), "add with a 31-byte key"),
        (add_request(t(), 101, 0, b"x", key=b""), "add without a key"),
        (
            AddRequest(t(), 101, 0, AddFlag(4), master_key=KEY, body=entry_body(101, 0, b"x")),
            "add with an undefined flag",
        ),
        (ReadRequest(t(), 101, -2), "read of entry -2"),
        (ReadRequest(t(), 101, 0, ReadFlag(8)), "read with an undefined flag"),
        (ReadRequest(t(), 101, 0, ReadFlag.FENCE, b""), "fencing read without a key"),
        (
            ReadRequest(t(), 101, 0, ReadFlag.LONG_POLL, b"", 0, -1000),
            "long poll, negative timeout",
        ),
        (
            ReadRequest(t(), 101, 0, ReadFlag.LONG_POLL, b"", -7, 1000),
            "long poll, previous LAC -7",
        ),
        (WriteLacRequest(t(), 101, KEY, -2), "explicit LAC -2"),
        (WriteLacRequest(t(), unused + 2, LONG_KEY, 0), "explicit LAC, 300-byte key"),
        (ForceRequest(t(), 101, LONG_KEY), "force with a 300-byte key"),
        (ReadLacRequest(t(), -5), "LAC read of ledger -5"),
    ]
    conn.send_many(request for request, _why in cases)
    return {request.txn_id: why for request, why in cases}


@pytest.mark.timeout(60)
async def test_poison_requests_get_ebadreq_and_the_bookie_checkpoints_and_restarts(
    launch: Launch, connect: Connect
) -> None:
    bookie = await launch(flush_interval=0.2)
    conn = await connect(bookie)
    poison = _poison(conn)
    answers = await conn.wait_for(poison, 10)
    wrong = {why: answers[txn].status.name for txn, why in poison.items()}
    wrong = {why: status for why, status in wrong.items() if status != "EBADREQ"}
    assert not wrong, f"answered other than EBADREQ: {wrong}"

    # The same connection keeps working, and an entry id far out but within what storage holds
    # now (u64 page numbers) is stored, not refused.
    good: list[tuple[int, int, bytes]] = [(101, 0, b"first"), (104, FAR_ENTRY, b"far")]
    for ledger, entry, payload in good:
        added = await conn.call(add_request(conn.next_txn_id(), ledger, entry, payload))
        assert added.status is StatusCode.EOK, (ledger, entry, added)
    before = await conn.stats()
    assert before["bad_requests"] >= len(poison)

    stats = await _checkpoints_after(bookie, before["checkpoints"] + 1)
    assert stats["checkpoints"] > before["checkpoints"] + 1, "no checkpoint after the poison"
    assert stats["checkpoint_failures"] == 0, bookie.log_text()
    assert bookie.terminate() == 0, bookie.log_text()

    await bookie.start()  # the index and the journal tail both load
    conn = await connect(bookie)
    for ledger, entry, payload in good:
        response = await conn.call(ReadRequest(conn.next_txn_id(), ledger, entry))
        assert response.status is StatusCode.EOK, (ledger, entry, response)
        assert getattr(response, "body", None) == entry_body(ledger, entry, payload)
    stats = await conn.stats()
    assert stats["journal_records_skipped"] == 0
    assert bookie.terminate() == 0, bookie.log_text()


def _old_journal() -> tuple[bytes, dict[tuple[int, int], bytes], int]:
    """A journal as the code before the fix wrote it after acknowledging poison: the file, the
    entries that must read back, and how many records must be left out."""
    long_key_ledger, far_ledger = 201, 202
    far_body = entry_body(far_ledger, 2**50, b"far")
    kept_body = entry_body(long_key_ledger, 0, b"kept")
    records = [
        # A 300-byte key: left out (the ledger stays, its key unknown, like a limbo ledger).
        (RecordType.MASTER_KEY, LEDGER_PREFIX.pack(long_key_ledger) + LONG_KEY),
        (RecordType.ADD, journal_add_payload(long_key_ledger, 0, kept_body)),
        (RecordType.MASTER_KEY, LEDGER_PREFIX.pack(far_ledger) + KEY),
        # Entry 2**50: page number 2**38, past the old u32 page numbers; stored now.
        (RecordType.ADD, journal_add_payload(far_ledger, 2**50, far_body)),
        # Entry 2**63-1: past what any entry id may be (id + 1 must fit); left out.
        (
            RecordType.ADD,
            ADD_PREFIX.pack(far_ledger, INT64_MAX) + entry_body(far_ledger, INT64_MAX, b"no"),
        ),
    ]
    data = encode_file_header(0) + b"".join(
        encode_record(kind, lsn, payload) for lsn, (kind, payload) in enumerate(records)
    )
    expected = {(long_key_ledger, 0): kept_body, (far_ledger, 2**50): far_body}
    assert MAX_ENTRY_ID < INT64_MAX
    return data, expected, 2


async def _read_all(conn: RawConnection, entries: dict[tuple[int, int], bytes]) -> None:
    for (ledger, entry), body in entries.items():
        response: Response = await conn.call(ReadRequest(conn.next_txn_id(), ledger, entry))
        assert response.status is StatusCode.EOK, (ledger, entry, response)
        assert getattr(response, "body", None) == body


@pytest.mark.timeout(60)
async def test_a_journal_holding_poison_written_before_the_fix_replays(
    launch: Launch, connect: Connect
) -> None:
    data, entries, skipped = _old_journal()
    bookie = await launch(flush_interval=0.2)
    assert bookie.terminate() == 0  # directories and cookies made; now plant the journal
    journal = bookie.data_dir / "journal"
    for old in journal.glob("*.txn"):
        old.unlink()
    (journal / f"{0:016x}.txn").write_bytes(data)
    (bookie.data_dir / "ledgers" / "index").mkdir(parents=True, exist_ok=True)
    for segment in (bookie.data_dir / "ledgers" / "index").glob("*.idx"):
        segment.unlink()  # replay from LSN 0

    await bookie.start()
    stats = await bookie.stats()
    assert stats["journal_records_skipped"] == skipped, bookie.log_text()
    assert "cannot keep" in bookie.log_text()
    await _read_all(await connect(bookie), entries)
    stats = await _checkpoints_after(bookie, stats["checkpoints"])
    assert stats["checkpoint_failures"] == 0, bookie.log_text()
    assert bookie.terminate() == 0, bookie.log_text()

    # The checkpoint covered the journal: the next start replays nothing and skips nothing.
    await bookie.start()
    stats = await bookie.stats()
    assert stats["journal_records_skipped"] == 0
    await _read_all(await connect(bookie), entries)
    assert bookie.terminate() == 0, bookie.log_text()
