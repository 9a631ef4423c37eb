"""Small things a new user trips over, each checked where the user meets it: one name for the
cookie commands, a missing metadata URI said before any question, readable client statistics,
``make clean`` leaving nothing of a standalone cluster behind, and an unreachable etcd
explained in a few words on one line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from aiobk import BookKeeper, errors
from aiobk.metadata import MemoryKV, free_port
from tests.support.cli import aiobk_on_terminal, aiobk_sync

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


def test_the_cookie_commands_have_one_name() -> None:
    top = aiobk_sync("--help")
    bookie = aiobk_sync("bookie", "--help")
    assert "  cookie " in top.stdout
    assert "cookie" not in bookie.stdout  # listed once, as `aiobk cookie`
    missing = "aiobk: error: no bookie data directory at /nonexistent/aiobk\n"
    listed = aiobk_sync("cookie", "show", "--data-dir", "/nonexistent/aiobk")
    assert (listed.returncode, listed.stderr) == (1, missing)
    # The second name still works for scripts that use it, and says which one to use.
    alias = aiobk_sync("bookie", "cookie", "show", "--data-dir", "/nonexistent/aiobk")
    assert alias.returncode == 1
    assert alias.stderr == (
        f"DeprecationWarning: The command 'cookie' is deprecated. Use `aiobk cookie`.\n{missing}"
    )


def test_a_missing_metadata_uri_is_said_before_any_question(tmp_path: Path) -> None:
    for args in (("ledger", "delete", "5"), ("log", "delete", "orders")):
        piped = aiobk_sync(*args)
        assert (piped.returncode, piped.stderr) == (
            2,
            "aiobk: error: --metadata (or AIOBK_METADATA) is required\n",
        ), args
        status, _out, shown = aiobk_on_terminal(*args, answer=b"y\n")
        assert status == 2, shown
        assert "[y/N]" not in shown
        assert "--metadata (or AIOBK_METADATA) is required" in shown


async def test_client_statistics_print_their_figures() -> None:
    bk = BookKeeper("memory://stats-repr")
    bk.stats.append_latency.record(0.002)
    bk.stats.append_latency.record(0.004)
    shown = repr(bk.stats)
    await bk.close()
    MemoryKV.forget("stats-repr")
    assert "object at 0x" not in shown
    assert "append_latency=Histogram(count=2, sum=0.006, mean=0.003)" in shown


def test_make_clean_removes_the_standalone_data(tmp_path: Path) -> None:
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "standalone-data" / "etcd").mkdir(parents=True)
    (tmp_path / "demo-output").mkdir()
    subprocess.run(["make", "clean"], cwd=tmp_path, check=True, capture_output=True, timeout=30)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Makefile"]


async def test_an_unreachable_etcd_is_one_line_in_a_few_words() -> None:
    uri = f"etcd://127.0.0.1:{free_port()}/aiobk"
    with pytest.raises(errors.MetadataStoreError) as raised:
        await BookKeeper.connect(uri)
    assert str(raised.value) == (
        f"{uri.removesuffix('/aiobk')} is unreachable (get): connection refused (is etcd "
        "running on that port?)"
    )
    shown = aiobk_sync("bookies", "list", "--metadata", uri)
    assert shown.stderr == f"aiobk: error: {raised.value}\n"
