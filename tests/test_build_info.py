"""``aiobk_build_info{version, python} 1`` in every process that serves metrics: a bookie's
exporter and its HTTP admin API, and a standalone autorecovery process's exporter."""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import aiobk
from aiobk.metadata import EtcdProcess, free_port
from aiobk.metrics import BUILD_INFO_HELP, register_build_info
from tests.support.names import unique_name
from tests.support.procs import BookieProcess

EXPECTED = {"version": aiobk.__version__, "python": platform.python_version()}


def build_info(text: str) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "aiobk_build_info"
        for sample in family.samples
    ]


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return bytes(answer.read()).decode()


@pytest.mark.timeout(10)
def test_build_info_is_registered_once_per_registry() -> None:
    """Each bookie of a standalone cluster asks for it on the process's one registry."""
    registry = CollectorRegistry()  # describes its collectors: a second one would clash
    register_build_info(registry)
    register_build_info(registry)
    text = generate_latest(registry).decode()
    assert build_info(text) == [(EXPECTED, 1.0)]
    assert f"# HELP aiobk_build_info {BUILD_INFO_HELP}" in text
    assert aiobk.__version__ != "0+unknown"  # the tests run an installed aiobk


@pytest.mark.timeout(90)
async def test_bookie_and_autorecovery_processes_export_their_build(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    uri = etcd_server.uri(unique_name("build"))
    metrics, http, recovery_metrics = free_port(), free_port(), free_port()
    bookie = BookieProcess(
        tmp_path / "data", None, "--metadata", uri, "--metrics-port", str(metrics),
        "--http-port", str(http),
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "AIOBK_METADATA"}
    recovery = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiobk", "autorecovery", "start", "--metadata", uri,
        "--metrics-port", str(recovery_metrics), "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert recovery.stdout is not None
    try:
        await bookie.start()
        line = await asyncio.wait_for(recovery.stdout.readline(), 30)
        assert line.decode().startswith("autorecovery "), line
        for url in (
            f"http://127.0.0.1:{metrics}/metrics",
            f"http://127.0.0.1:{http}/metrics",
            f"http://127.0.0.1:{recovery_metrics}/metrics",
        ):
            text = await asyncio.to_thread(scrape, url)
            assert build_info(text) == [(EXPECTED, 1.0)], url
    finally:
        bookie.stop()
        if recovery.returncode is None:
            recovery.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(recovery.communicate(), 20)
            finally:
                if recovery.returncode is None:
                    recovery.kill()
                    await recovery.wait()
