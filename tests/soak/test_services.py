"""The soak's writer service when its writer fails: it reports the failed appends, opens a new
writer and carries on with the next sequence numbers, and what it reports agrees with what the
log holds. The failure is a takeover by another writer, the one failure a writer must report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess
from aiobk.protocol.errors import LedgerFencedError
from tests.conftest import BookieFactory
from tests.soak.checks import check_log
from tests.soak.cluster import Service
from tests.soak.run import SoakResult, record
from tests.soak.service import sequence_of
from tests.soak.settings import SoakSettings
from tests.support.names import unique_name
from tests.support.wait import wait_until

LOG = "taken-over"
WAIT = 60.0


@pytest.mark.timeout(180)
async def test_the_writer_service_reports_a_takeover_and_carries_on(
    etcd_server: EtcdProcess, start_bookie: BookieFactory, tmp_path: Path
) -> None:
    uri = etcd_server.uri(unique_name("soak"))
    for _ in range(3):
        await start_bookie(metadata_uri=uri)
    result = SoakResult(SoakSettings())
    notes: list[str] = []
    events: list[dict[str, Any]] = []

    def on_event(name: str, event: dict[str, Any]) -> None:
        events.append(event)
        record(result, name, event, notes.append)

    # No roll in this test (small records, big ledgers): only the takeover changes ledgers.
    args = ["--metadata", uri, "--log", LOG, "--rate", "200", "--record-size", "64"]
    writer = Service("writer", [*args, "--roll-bytes", str(2**30)], tmp_path / "w.log", on_event)
    await writer.start()
    try:
        history = result.history
        await wait_until(lambda: history.acked >= 100, timeout=WAIT)
        async with BookKeeper(uri) as bk:
            other = await bk.open_log_writer(LOG)  # fences the service's writer
            await wait_until(lambda: any("reopened" in event for event in events), timeout=WAIT)
            acked_before = history.acked
            await wait_until(lambda: history.acked >= acked_before + 100, timeout=WAIT)
            assert await writer.stop() == 0
            with pytest.raises(LedgerFencedError):
                await other.append(b"late")  # the service's new writer took it back
            async for entry in await bk.open_log_reader(LOG, follow=False):
                sequence, intact = sequence_of(bytes(entry.data))
                history.read(sequence, entry.position.ledger_id, entry.position.entry_id, intact)
    finally:
        writer.kill()
        await writer.stop(10.0)
    assert history.failed, events
    assert all("Fenced" in error for error in history.failed.values())
    assert history.called == history.acked + len(history.failed) + len(history.unresolved)
    assert not history.unresolved
    verdict = check_log(history)
    assert verdict.violations == []
    assert result.writer_failures
    assert any("writer reopened" in event for event in result.service_events)
