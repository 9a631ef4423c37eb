"""Who keeps etcd's history bounded (etcd keeps every revision until compacted, and at its
quota refuses every write): the etcd ``aiobk standalone`` starts compacts by itself
(``--auto-compaction-*``, read here from the running etcd's command line), and a bookie says so
at start when it will not compact (``gc_interval`` or ``metadata_history_revisions`` 0)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from aiobk.metadata import MemoryKV
from aiobk.metadata.etcd_process import AUTO_COMPACTION, free_port
from tests.conftest import BookieFactory
from tests.support.names import unique_name
from tests.support.standalone_process import StandaloneProcess, child_etcd, free_pair

WARNING_TEXT = "nothing here compacts etcd's history"


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        args = [arg.decode() for arg in handle.read().split(b"\0") if arg]
    assert args, f"no command line for process {pid}"
    return args


@pytest.mark.timeout(120)
def test_standalone_runs_its_etcd_with_auto_compaction(tmp_path: Path) -> None:
    standalone = StandaloneProcess(tmp_path / "data", free_pair(), free_port())
    try:
        standalone.wait_for("standalone cluster ready")
        etcd_pid = child_etcd(standalone.proc.pid)
        args = _cmdline(etcd_pid)
        assert args[0].endswith("etcd"), args  # etcd itself, not the launcher
        flags = dict(arg.split("=", 1) for arg in args[1:] if arg.startswith("--") and "=" in arg)
        assert flags.get("--auto-compaction-mode") == "revision", args
        retention = int(flags.get("--auto-compaction-retention", "0"))
        assert 0 < retention <= 1_000_000, args  # revisions kept: bounded, and not none
        assert set(AUTO_COMPACTION) <= set(args)
    finally:
        standalone.close()
    assert standalone.proc.returncode == 0, standalone.output


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ({"gc_interval": 0.0}, True),
        ({"metadata_history_revisions": 0}, True),
        ({"gc_interval": 0.0, "metadata_history_revisions": 0}, True),
        ({}, False),  # the defaults compact after every GC pass
        ({"gc_interval": 60.0, "metadata_history_revisions": 5_000}, False),
    ],
)
@pytest.mark.timeout(30)
async def test_a_bookie_warns_at_start_when_it_will_not_compact_etcds_history(
    start_bookie: BookieFactory,
    caplog: pytest.LogCaptureFixture,
    settings: dict[str, Any],
    warned: bool,
) -> None:
    name = unique_name("history")
    caplog.set_level(logging.WARNING, logger="aiobk.bookie.server")
    try:
        bookie = await start_bookie(metadata_uri=f"memory://{name}", **settings)
    finally:
        MemoryKV.forget(name)
    warnings = [
        record
        for record in caplog.records
        if record.levelno == logging.WARNING and WARNING_TEXT in record.getMessage()
    ]
    assert len(warnings) == (1 if warned else 0), [r.getMessage() for r in caplog.records]
    if warned:
        message = warnings[0].getMessage()
        assert bookie.bookie_id in message
        assert "--auto-compaction-retention" in message  # what to do about it


@pytest.mark.timeout(30)
async def test_a_bookie_without_a_metadata_store_does_not_warn(
    start_bookie: BookieFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """No store, no etcd history to speak of."""
    caplog.set_level(logging.WARNING, logger="aiobk.bookie.server")
    await start_bookie(gc_interval=0.0)
    assert not [r for r in caplog.records if WARNING_TEXT in r.getMessage()]
