"""A bookie process's exporter serves the figures of the autorecovery running beside it."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import pytest

from aiobk.metadata import EtcdProcess, free_port
from tests.support.names import unique_name
from tests.support.procs import BookieProcess
from tests.support.wait import wait_until


@pytest.mark.timeout(60)
async def test_a_bookies_exporter_serves_its_autorecovery_figures(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    metrics = free_port()
    uri = etcd_server.uri(unique_name("metrics"))
    proc = BookieProcess(tmp_path / "data", None, "--metrics-port", str(metrics), "--metadata", uri)
    await proc.start()
    try:
        url = f"http://127.0.0.1:{metrics}/metrics"

        def scrape() -> bytes:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return bytes(answer.read())

        scraped: list[bytes] = []
        elected = re.compile(
            rb'aiobk_autorecovery_auditor_elections_total\{bookie="([^"]+)",node="\1"\} 1\.0'
        )

        async def elected_seen() -> bool:
            scraped.append(await asyncio.to_thread(scrape))
            return elected.search(scraped[-1]) is not None

        # The only bookie: elected auditor within a poll or two.
        await wait_until(elected_seen, every=0.2, timeout=30, what="the bookie elected auditor")
        text = scraped[-1]
        assert b"aiobk_bookie_journal_syncs_total" in text
        for name in (
            b"aiobk_autorecovery_under_replicated_ledgers",
            b"aiobk_autorecovery_lost_ledgers",
            b"aiobk_autorecovery_bytes_replicated_total",
            b"aiobk_autorecovery_entries_replicated_total",
        ):
            assert name in text, name
    finally:
        proc.stop()
