"""Autorecovery's keys (metadata.autorecovery), one contract over memory:// and a real etcd:
marks widen by compare-and-set and go only at the version read, claims exclude each other and
vanish with their lease, workers' attempts, one auditor at a time, the switch, audit requests,
the secret."""

from __future__ import annotations

import asyncio

import pytest

from aiobk.metadata import (
    CHECK,
    DECOMMISSION,
    LOST_BOOKIE,
    AuditorStatus,
    MetadataStore,
    RepairAttempt,
    UnderReplication,
)
from aiobk.metadata.autorecovery import FAILED
from aiobk.protocol.errors import MetadataVersionError


async def test_a_mark_is_made_widened_and_kept_when_asked_again(store: MetadataStore) -> None:
    marks = store.autorecovery
    first = await marks.mark(7, ["b1"], LOST_BOOKIE, 1000)
    assert (first.missing, first.since, first.reasons) == (("b1",), 1000, (LOST_BOOKIE,))
    same = await marks.mark(7, ["b1"], LOST_BOOKIE, 5000)
    assert same == first  # nothing new: no write
    assert same.version == first.version
    wider = await marks.mark(7, ["b2"], CHECK, 9000)
    assert wider.missing == ("b1", "b2")
    assert wider.since == 1000  # when it was first marked
    assert wider.reasons == (CHECK, LOST_BOOKIE)
    assert await marks.read_mark(7) == wider


async def test_a_mark_goes_only_at_the_version_read(store: MetadataStore) -> None:
    marks = store.autorecovery
    read = await marks.mark(3, ["b1"], LOST_BOOKIE, 1)
    await marks.mark(3, ["b2"], LOST_BOOKIE, 2)  # the auditor widened it meanwhile
    with pytest.raises(MetadataVersionError):
        await marks.unmark(read)
    with pytest.raises(MetadataVersionError):
        await marks.write_mark(read.with_lost([(4, 9)]))
    current = await marks.read_mark(3)
    assert current is not None
    reported = await marks.write_mark(current.with_lost([(4, 9), (12, 12)]))
    assert (await marks.read_mark(3)) == reported
    assert reported.lost == ((4, 9), (12, 12))
    await marks.unmark(reported)
    assert await marks.read_mark(3) is None
    await marks.unmark(reported)  # gone already: nothing to do


async def test_marks_list_in_ledger_order_from_a_cursor(store: MetadataStore) -> None:
    marks = store.autorecovery
    for ledger_id in (30, 4, 1000, 17):
        await marks.mark(ledger_id, ["b"], DECOMMISSION, 0)
    assert [m.ledger_id async for m in marks.marks(page_size=2)] == [4, 17, 30, 1000]
    assert [m.ledger_id async for m in marks.marks(page_size=2, after_ledger=17)] == [30, 1000]
    assert [i async for i in marks.marked_ids(page_size=3)] == [4, 17, 30, 1000]


async def test_a_claim_excludes_others_and_lapses_with_its_lease(store: MetadataStore) -> None:
    marks, kv = store.autorecovery, store.kv
    lease, _ttl = await kv.grant_lease(60)
    other, _ttl = await kv.grant_lease(60)
    taken = await marks.claim(5, "w1", lease)
    assert taken is not None
    assert await marks.claim(5, "w2", other) is None
    assert await marks.claimant(5) == "w1"
    await marks.release(5, taken + 1000)  # not the claim taken: left alone
    assert await marks.claimant(5) == "w1"
    await kv.revoke_lease(lease)  # the holder died: its claim goes with its lease
    assert await marks.claimant(5) is None
    again = await marks.claim(5, "w2", other)
    assert again is not None
    await marks.release(5, again)
    assert await marks.claimant(5) is None


async def test_a_workers_attempt_is_noted_keeps_its_reason_and_goes_with_its_lease(
    store: MetadataStore,
) -> None:
    marks, kv = store.autorecovery, store.kv
    lease, _ttl = await kv.grant_lease(60)
    failed = RepairAttempt(5, "w1", 1000, FAILED, "no-bookie-outside-ensemble", "need 1",
                           failures=2, retry_at=9000, updated=2000)  # fmt: skip
    await marks.note_attempt(failed, lease)
    assert await marks.read_attempt(5) == failed
    # The next attempt, under way, says nothing yet of its own: the last reason stays with it.
    again = RepairAttempt(5, "w2", 3000, entries_to_copy=10, entries_copied=4, updated=3500)
    await marks.note_attempt(again, lease)
    read = await marks.read_attempt(5)
    assert read is not None
    assert (read.worker, read.state, read.entries_copied) == ("w2", "repairing", 4)
    assert (read.kind, read.detail) == ("no-bookie-outside-ensemble", "need 1")
    await marks.clear_attempt(5)
    assert await marks.read_attempt(5) is None
    await marks.clear_attempt(5)  # none: nothing to do
    await marks.note_attempt(failed, lease)
    await kv.revoke_lease(lease)  # the worker died: its note goes with it (and its backoff)
    assert await marks.read_attempt(5) is None


async def test_one_auditor_at_a_time(store: MetadataStore) -> None:
    marks, kv = store.autorecovery, store.kv
    first, _ttl = await kv.grant_lease(60)
    second, _ttl = await kv.grant_lease(60)
    assert await marks.auditor() is None
    assert await marks.elect("a1", first)
    assert not await marks.elect("a2", second)
    published = AuditorStatus("a1", {"b9": 12}, {"b8": 20}, 5, 6, {"grace": 30.0})
    status = await marks.publish_status(published, first)
    assert await marks.read_status() == status
    assert status.settings == {"grace": 30.0}
    await kv.revoke_lease(first)
    assert await marks.auditor() is None
    assert await marks.read_status() is None  # the status lived under the auditor's lease
    assert await marks.elect("a2", second)
    assert await marks.auditor() == "a2"


async def test_switch_audit_requests_decommissioning_and_the_secret(store: MetadataStore) -> None:
    marks = store.autorecovery
    assert await marks.enabled()
    await marks.set_enabled(False)
    await marks.set_enabled(False)
    assert not await marks.enabled()
    await marks.set_enabled(True)
    assert await marks.enabled()
    assert await marks.audit_requested() == 0
    first = await marks.request_audit()
    assert await marks.audit_requested() == first
    assert await marks.request_audit() > first
    await marks.set_decommissioning("b1:1", True)
    await marks.set_decommissioning("b2:2", True)
    assert await marks.decommissioning() == {"b1:1", "b2:2"}
    await marks.set_decommissioning("b1:1", False)
    assert await marks.decommissioning() == {"b2:2"}
    assert await marks.cluster_secret() is None  # nobody made it: a bookie reads None
    made = await asyncio.gather(*(marks.cluster_secret(bytes([i]).__mul__) for i in (1, 2)))
    assert made[0] == made[1]  # racing makers agree on one secret
    assert len(made[0] or b"") == 32
    assert await marks.cluster_secret() == made[0]


def test_a_damaged_mark_is_a_format_error() -> None:
    from aiobk.metadata import MetadataFormatError

    with pytest.raises(MetadataFormatError):
        UnderReplication.from_json(b'{"format": 1, "ledger_id": "x"}')
    with pytest.raises(MetadataFormatError):
        AuditorStatus.from_json(b"[]")
