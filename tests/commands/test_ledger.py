"""aiobk simpletest / ledger read|recover|delete against real bookies and etcd."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, ClientConfig, Durability
from aiobk.protocol.errors import NoSuchLedgerError
from tests.support.cli import aiobk, aiobk_on_terminal
from tests.support.cluster import Cluster


async def bookies_know_lac(bk: BookKeeper, ledger_id: int, password: bytes, lac: int) -> None:
    """Wait until the bookies report ``lac`` (the writer sends its last one explicitly)."""
    rh = await bk.open_ledger(ledger_id, password, recovery=False)
    async with asyncio.timeout(10):
        while await rh.read_last_add_confirmed() < lac:
            await asyncio.sleep(0.02)


async def test_ledger_read_leaves_a_live_writer_writing(etcd_cluster: Cluster) -> None:
    """``ledger read`` reads up to the LAC the bookies report and fences nothing: fencing the
    ledger it reads would fail its writer's next append with LedgerFencedError."""
    uri = etcd_cluster.uri
    async with await BookKeeper.connect(uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            await lh.append(b"line %d" % i)
        await bookies_know_lac(bk, lh.ledger_id, b"pw", 4)
        read = await aiobk(
            "ledger", "read", str(lh.ledger_id), "--metadata", uri, "--password", "pw"
        )
        assert read.returncode == 0, read.stderr
        assert read.stdout.splitlines() == [f"{i}\tline {i}" for i in range(5)]
        assert await lh.append(b"line 5") == 5  # fenced before: LedgerFencedError
        shown = json.loads(
            (await aiobk("ledger", "show", str(lh.ledger_id), "--metadata", uri, "--json")).stdout
        )
        assert shown["state"] == "OPEN"
        await lh.close()


async def test_simpletest(etcd_cluster: Cluster) -> None:
    result = await aiobk(
        "simpletest", "--metadata", etcd_cluster.uri, "--entries", "200", "--entry-size", "64"
    )
    assert result.returncode == 0, result.stderr
    assert "wrote 200 entries" in result.stdout
    assert "all verified" in result.stdout


async def test_simpletest_honours_size_in_flight_durability_and_cleans_up(
    etcd_cluster: Cluster,
) -> None:
    """--entry-size exactly (5 bytes was 10), --in-flight and --durability taken, the add
    latency apart from the wait for an in-flight slot, and no ledger left behind unless
    --keep."""
    uri = etcd_cluster.uri
    common = ("simpletest", "--metadata", uri, "--entries", "50", "--entry-size", "5")
    run = await aiobk(*common, "--in-flight", "4", "--durability", "volatile", "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert (summary["entry_size"], summary["in_flight"]) == (5, 4)
    assert (summary["durability"], summary["kept"]) == ("volatile", False)
    assert 0 < summary["append_latency_ms"]["p50"] <= summary["append_latency_ms"]["max"]
    assert summary["slot_wait_ms"]["p50"] <= summary["slot_wait_ms"]["max"]
    async with BookKeeper(uri) as bk:
        with pytest.raises(NoSuchLedgerError):
            await bk.store.read_ledger(summary["ledger_id"])
    kept = await aiobk(*common, "--keep", "--json")
    assert kept.returncode == 0, kept.stderr
    ledger_id = json.loads(kept.stdout)["ledger_id"]
    async with BookKeeper(uri) as bk:
        rh = await bk.open_ledger(ledger_id, recovery=False)
        entries = await rh.read(0, 49)
        assert {len(entry.data) for entry in entries} == {5}
        assert rh.metadata.durability is Durability.PERSISTENT
        await bk.delete_ledger(ledger_id)
    bad = await aiobk(*common, "--in-flight", "0")
    assert bad.returncode == 2
    assert "--in-flight" in bad.stderr


async def test_ledger_read_recover_and_errors(etcd_cluster: Cluster) -> None:
    uri = etcd_cluster.uri
    config = ClientConfig(explicit_lac_delay=0)  # the bookies learn the LAC only from adds
    async with BookKeeper(uri, config) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            await lh.append(b"line %d" % i)  # left open: the writer "died"
    ledger = str(lh.ledger_id)
    read = await aiobk("ledger", "read", ledger, "--metadata", uri, "--password", "pw")
    assert read.returncode == 0, read.stderr
    # Up to the LAC the bookies report: entry 4's confirmation came with no later add.
    assert read.stdout.splitlines() == [f"{i}\tline {i}" for i in range(4)]
    past = await aiobk("ledger", "read", ledger, "--metadata", uri, "--password", "pw", "--to", "4")
    assert past.returncode == 1
    assert past.stderr == (
        f"aiobk: error: ledger {ledger}: --to 4 is past its last add confirmed (3; the ledger "
        "is open)\n"
    )
    some = await aiobk(
        "ledger", "read", ledger, "--metadata", uri,
        "--password", "pw", "--from", "1", "--to", "2", "--json",
    )  # fmt: skip
    assert [json.loads(x)["entry_id"] for x in some.stdout.splitlines()] == [1, 2]
    assert base64.b64decode(json.loads(some.stdout.splitlines()[0])["data_base64"]) == b"line 1"
    backwards = await aiobk("ledger", "read", ledger, "--metadata", uri, "--from", "5", "--to", "3")
    assert backwards.returncode == 2
    assert backwards.stderr == "aiobk: error: --from 5 is after --to 3\n"
    wrong = await aiobk("ledger", "read", ledger, "--metadata", uri, "--password", "no")
    assert wrong.returncode == 1
    assert wrong.stderr == (
        f"aiobk: error: wrong password for ledger {ledger}: the --password given is not the "
        "ledger's\n"
    )
    # --recover fences and closes: every entry a quorum holds, then the ledger's end.
    full = await aiobk("ledger", "read", ledger, "--metadata", uri, "--password", "pw", "--recover")
    assert full.stdout.splitlines() == [f"{i}\tline {i}" for i in range(5)]
    recovered = await aiobk(
        "ledger", "recover", ledger, "--metadata", uri, "--password", "pw", "--json"
    )
    assert recovered.returncode == 0, recovered.stderr
    document = json.loads(recovered.stdout)
    assert document["state"] == "CLOSED"
    assert document["last_entry_id"] == 4
    table = await aiobk("ledger", "recover", ledger, "--metadata", uri, "--password", "pw")
    assert "CLOSED" in table.stdout
    # The old opt-out flag is still accepted (hidden): the default now.
    old = await aiobk(
        "ledger", "read", ledger, "--metadata", uri, "--password", "pw", "--no-recovery"
    )
    assert old.stdout.splitlines() == [f"{i}\tline {i}" for i in range(5)]


async def test_ledger_delete_asks_first(etcd_cluster: Cluster) -> None:
    """``ledger delete`` asks on a terminal unless --yes, refuses without one, and checks
    --password against the ledger's."""
    uri = etcd_cluster.uri
    async with BookKeeper(uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        await lh.append(b"keep me")
        await lh.close()
        ledger = str(lh.ledger_id)

        async def exists(ledger_id: str = ledger) -> bool:
            return ledger_id in (await aiobk("ledger", "list", "--metadata", uri)).stdout.split()

        piped = await aiobk("ledger", "delete", ledger, "--metadata", uri)
        assert piped.returncode == 2
        assert piped.stderr == (
            f"aiobk: error: deleting ledger {ledger} needs confirmation and stdin is not a "
            "terminal; pass --yes\n"
        )
        assert await exists()
        # A ledger with a password is deleted only with it (or by an operator).
        needs = await aiobk("ledger", "delete", ledger, "--metadata", uri, "--yes")
        assert needs.returncode == 1
        assert needs.stderr == (
            f"aiobk: error: ledger {ledger} has a password: pass --password (or "
            "--no-password-check, as an operator the metadata store lets delete)\n"
        )
        assert await exists()
        status, out, shown = await asyncio.to_thread(
            aiobk_on_terminal, "ledger", "delete", ledger, "--metadata", uri,
            "--password", "pw", answer=b"n\n",
        )  # fmt: skip
        assert f"Delete ledger {ledger} (CLOSED, entries 0..0, 7 bytes)? [y/N]" in shown
        assert status == 1
        assert f"aiobk: error: ledger {ledger} not deleted" in shown
        assert await exists()
        wrong = await aiobk(
            "ledger", "delete", ledger, "--metadata", uri, "--yes", "--password", "x"
        )
        assert wrong.returncode == 1
        assert wrong.stderr == (
            f"aiobk: error: wrong password for ledger {ledger}: the --password given is not "
            "the ledger's\n"
        )
        status, out, shown = await asyncio.to_thread(
            aiobk_on_terminal, "ledger", "delete", ledger, "--metadata", uri, "--password", "x"
        )
        assert status == 1
        assert "wrong password" in shown
        assert "Delete ledger" not in shown  # refused before asking
        assert await exists()
        status, out, shown = await asyncio.to_thread(
            aiobk_on_terminal, "ledger", "delete", ledger, "--metadata", uri,
            "--password", "pw", answer=b"y\n",
        )  # fmt: skip
        assert status == 0, shown
        assert out == f"deleted ledger {ledger}\n"
        assert not await exists()

        other = await bk.create_ledger(3, 3, 2)
        await other.close()
        yes = await aiobk(
            "ledger", "delete", str(other.ledger_id), "--metadata", uri, "-y", "--json"
        )
        assert yes.returncode == 0, yes.stderr
        assert json.loads(yes.stdout) == {"ledger_id": other.ledger_id, "deleted": True}
        assert not await exists(str(other.ledger_id))
        gone = await aiobk("ledger", "delete", str(other.ledger_id), "--metadata", uri, "--yes")
        assert gone.returncode == 1
        assert "does not exist" in gone.stderr

        third = await bk.create_ledger(3, 3, 2, password=b"forgotten")
        await third.close()
        operator = await aiobk(
            "ledger", "delete", str(third.ledger_id), "--metadata", uri, "--yes",
            "--no-password-check",
        )  # fmt: skip
        assert operator.returncode == 0, operator.stderr
        assert not await exists(str(third.ledger_id))
        both = await aiobk(
            "ledger", "delete", "1", "--metadata", uri, "--password", "x", "--no-password-check"
        )
        assert both.returncode == 2
        assert "contradict" in both.stderr


async def test_ledger_read_into_a_closed_pipe_ends_quietly(
    etcd_cluster: Cluster, tmp_path: Path
) -> None:
    """``aiobk ledger read ID | head -1`` ends with status 0 and nothing on stderr: no
    BrokenPipeError traceback, no "Exception ignored"."""
    uri = etcd_cluster.uri
    async with BookKeeper(uri) as bk, await bk.create_ledger(3, 3, 2) as lh:
        # ~1 MiB: well past the pipe's and stdout's buffers, so writes fail once head exits.
        await asyncio.gather(*(lh.append(b"%05d" % i + b"." * 250) for i in range(4000)))
    errors = tmp_path / "stderr"
    script = (
        f'"{sys.executable}" -c "from aiobk.cli import main; main()" ledger read '
        f'{lh.ledger_id} --metadata "{uri}" 2>"{errors}" | head -1; echo "${{PIPESTATUS[0]}}"'
    )
    result = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", script], capture_output=True, text=True, timeout=120
    )
    first, status = result.stdout.splitlines()
    assert first == "0\t00000" + "." * 250
    assert errors.read_text() == ""
    assert status == "0"


async def test_simpletest_json_and_no_progress_off_a_terminal(etcd_cluster: Cluster) -> None:
    """Simpletest reports appends/s and latency percentiles, --json for scripts;
    off a terminal it prints the summary and nothing else."""
    uri = etcd_cluster.uri
    result = await aiobk("simpletest", "--metadata", uri, "--entries", "300", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    summary = json.loads(result.stdout)  # one JSON document, nothing around it
    assert summary["entries"] == 300
    assert summary["verified"] is True
    assert summary["appends_per_second"] > 0
    latency = summary["append_latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    assert {"ledger_id", "write_seconds", "read_seconds", "entry_size"} <= summary.keys()
    plain = await aiobk("simpletest", "--metadata", uri, "--entries", "300")
    assert plain.stderr == ""
    (line,) = plain.stdout.splitlines()
    assert "append latency (call to confirmation) p50" in line
    assert "waited for an in-flight slot p50" in line
    assert line.endswith("all verified")


async def test_simpletest_shows_progress_on_a_terminal(etcd_cluster: Cluster) -> None:
    """Once silent for 45 s at 100,000 entries; on a terminal it now shows its progress."""
    status, out, shown = await asyncio.to_thread(
        aiobk_on_terminal, "simpletest", "--metadata", etcd_cluster.uri, "--entries", "3000"
    )
    assert status == 0, shown
    assert "appending" in shown
    assert "/3000" in shown  # done / total
    assert out.endswith("all verified\n")
