"""A log's offload policy, as a pure choice over its ledgers' metadata."""

from __future__ import annotations

from aiobk.client.offload.policy import due_ledgers
from aiobk.metadata import (
    Fragment,
    LedgerMetadata,
    LedgerState,
    OffloadPolicy,
    OffloadRecord,
    OffloadState,
)


def ledger(created_s: int, length: int, closed: bool = True) -> LedgerMetadata:
    return LedgerMetadata(
        3, 3, 2, (Fragment(0, ("a", "b", "c")),),
        state=LedgerState.CLOSED if closed else LedgerState.OPEN,
        last_entry_id=9 if closed else None,
        length=length if closed else 0,
        creation_time=created_s * 1000,
    )  # fmt: skip


LEDGERS = [1, 2, 3, 4]
META = {1: ledger(0, 100), 2: ledger(100, 100), 3: ledger(200, 100), 4: ledger(300, 0, False)}


def test_older_than_counts_from_the_roll_that_closed_each_ledger() -> None:
    policy = OffloadPolicy(older_than=150)
    assert due_ledgers(LEDGERS, META, policy, now_ms=260_000) == [1]  # ledger 2 began at 100
    assert due_ledgers(LEDGERS, META, policy, now_ms=360_000) == [1, 2]
    assert due_ledgers(LEDGERS, META, policy, now_ms=10**9) == [1, 2, 3]  # never the open one


def test_beyond_bytes_keeps_the_newest_bytes_on_the_bookies() -> None:
    assert due_ledgers(LEDGERS, META, OffloadPolicy(beyond_bytes=100), now_ms=0) == [1, 2]
    assert due_ledgers(LEDGERS, META, OffloadPolicy(beyond_bytes=150), now_ms=0) == [1]
    assert due_ledgers(LEDGERS, META, OffloadPolicy(beyond_bytes=0), now_ms=0) == [1, 2, 3]
    assert due_ledgers(LEDGERS, META, OffloadPolicy(beyond_bytes=10**6), now_ms=0) == []


def test_either_rule_makes_a_ledger_due_and_done_or_missing_ones_are_left() -> None:
    policy = OffloadPolicy(older_than=150, beyond_bytes=150)
    assert due_ledgers(LEDGERS, META, policy, now_ms=360_000) == [1, 2]
    record = OffloadRecord(
        uid="ab" * 16, store="file:///x", key="k", state=OffloadState.COPIED, started=1
    )
    meta = {**META, 1: META[1].with_offload(record)}
    del meta[2]  # deleted meanwhile
    assert due_ledgers(LEDGERS, meta, policy, now_ms=10**9) == [3]
    assert due_ledgers([], {}, policy, now_ms=10**9) == []
    assert due_ledgers(LEDGERS, META, OffloadPolicy(), now_ms=10**9) == []
