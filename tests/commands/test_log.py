"""``aiobk log list|show|tail|truncate|delete`` against real bookies and etcd."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, LogPosition
from tests.support.cli import aiobk
from tests.support.cluster import Cluster


async def confirmed(bk: BookKeeper, last: LogPosition) -> None:
    """Until the bookies report ``last`` confirmed (a quiet writer sends its LAC explicitly)."""
    handle = await bk.open_ledger(last.ledger_id, recovery=False)
    async with asyncio.timeout(10):
        while await handle.read_last_add_confirmed() < last.entry_id:
            await asyncio.sleep(0.02)


async def test_log_commands(etcd_cluster: Cluster) -> None:
    uri = etcd_cluster.uri
    async with BookKeeper(uri) as bk:
        listed = await aiobk("log", "list", "--metadata", uri, "--json")
        assert (listed.returncode, listed.stdout) == (0, "[]\n")
        writer = await bk.open_log_writer("orders", roll_bytes=40, record_format="raw")
        # 8 bytes each: a roll after every fifth; the 21st waits for the last roll to finish.
        positions = [await writer.append(b"order %02d" % i) for i in range(22)]
        ledgers = sorted({p.ledger_id for p in positions})
        assert len(ledgers) == 5
        assert list((await bk.store.read_log("orders")).ledgers) == ledgers
        await confirmed(bk, positions[-1])
        await (await bk.open_log_writer("audit")).close()

        listed = await aiobk("log", "list", "--metadata", uri)
        assert listed.stdout.splitlines() == ["audit", "orders"]
        assert json.loads((await aiobk("log", "list", "--metadata", uri, "--json")).stdout) == [
            "audit",
            "orders",
        ]

        shown = await aiobk("log", "show", "orders", "--metadata", uri, "--json")
        assert shown.returncode == 0, shown.stderr
        document = json.loads(shown.stdout)
        assert document["name"] == "orders"
        assert [x["ledger_id"] for x in document["ledgers"]] == ledgers
        assert [x["state"] for x in document["ledgers"]] == ["CLOSED"] * (len(ledgers) - 1) + [
            "OPEN"
        ]
        table = await aiobk("log", "show", "orders", "--metadata", uri)
        assert table.stdout.startswith(f"log orders: {len(ledgers)} ledgers, raw records\n")
        assert document["record_format"] == "raw"

        # A log of envelope records: tail --json carries each record's key, headers and time.
        async with await bk.open_log_writer("events", record_format="envelope") as events:
            at = await events.append(b"e", key=b"k", headers={"h": b"v"}, timestamp=5)
        evented = await aiobk("log", "tail", "events", "--metadata", uri, "--json")
        assert json.loads(evented.stdout) == {
            "position": str(at), "ledger_id": at.ledger_id, "entry_id": at.entry_id,
            "data_base64": base64.b64encode(b"e").decode(),
            "key_base64": base64.b64encode(b"k").decode(),
            "headers_base64": {"h": base64.b64encode(b"v").decode()}, "timestamp": 5,
        }  # fmt: skip
        plain = await aiobk("log", "tail", "events", "--metadata", uri)
        assert plain.stdout == f"{at}\t1970-01-01T00:00:00.005Z\tk\th=v\te\n"
        await bk.delete_log("events")

        # tail without --follow: to the end seen at the start, then exit; the writer is live.
        tail = await aiobk("log", "tail", "orders", "--metadata", uri)
        assert tail.returncode == 0, tail.stderr
        assert tail.stdout.splitlines() == [f"{p}\torder {i:02d}" for i, p in enumerate(positions)]
        assert await writer.append(b"still writing") > positions[-1]  # nothing was fenced
        start = positions[7]
        some = await aiobk(
            "log", "tail", "orders", "--from", str(start), "--metadata", uri, "--json"
        )
        records = [json.loads(line) for line in some.stdout.splitlines()]
        assert records[0] == {
            "position": str(start),
            "ledger_id": start.ledger_id,
            "entry_id": start.entry_id,
            "data_base64": base64.b64encode(b"order 07").decode(),
        }
        assert [LogPosition.parse(r["position"]) for r in records[:15]] == positions[7:]

        # One-line errors: unknown log, bad position, bad name.
        for args, status, message in [
            (("log", "show", "nope"), 1, "aiobk: error: log 'nope' does not exist"),
            (("log", "tail", "nope"), 1, "aiobk: error: log 'nope' does not exist"),
            (
                ("log", "truncate", "nope", "--before", "1:0"), 1,
                "aiobk: error: log 'nope' does not exist",
            ),
            (("log", "delete", "nope", "--yes"), 1, "aiobk: error: log 'nope' does not exist"),
            (
                ("log", "tail", "orders", "--from", "12"), 2,
                "aiobk: error: Invalid value for '--from': not a log position (LEDGER:ENTRY or "
                "earliest): '12'",
            ),
            (
                ("log", "truncate", "orders", "--before", "x:1"), 2,
                "aiobk: error: Invalid value for '--before': not a log position (LEDGER:ENTRY "
                "or earliest): 'x:1'",
            ),
            (("log", "truncate", "orders"), 2, "aiobk: error: Missing option '--before'."),
            (
                ("log", "show", "a/b"), 2,
                "aiobk: error: Invalid value for 'NAME': log name 'a/b': use 1-200 letters, "
                "digits, '.', '_' or '-', starting with a letter or digit",
            ),
        ]:  # fmt: skip
            result = await aiobk(*args, "--metadata", uri)
            assert (result.returncode, result.stderr) == (status, message + "\n"), args

        cut = LogPosition(ledgers[2], 0)
        truncated = await aiobk(
            "log", "truncate", "orders", "--before", str(cut), "--metadata", uri, "--json"
        )
        assert truncated.returncode == 0, truncated.stderr
        assert json.loads(truncated.stdout) == {
            "name": "orders",
            "before": str(cut),
            "deleted_ledgers": ledgers[:2],
        }
        again = await aiobk("log", "truncate", "orders", "--before", str(cut), "--metadata", uri)
        assert again.stdout == f"log orders: no ledger wholly below {cut}\n"
        rest = await aiobk("log", "tail", "orders", "--metadata", uri)
        assert rest.stdout.splitlines()[0] == f"{cut}\torder {positions.index(cut):02d}"

        await writer.close()
        refused = await aiobk("log", "delete", "orders", "--metadata", uri)
        assert refused.returncode == 2
        assert refused.stderr == (
            "aiobk: error: deleting log orders needs confirmation and stdin is not a terminal; "
            "pass --yes\n"
        )
        remaining = (await bk.store.read_log("orders")).ledgers
        deleted = await aiobk("log", "delete", "orders", "--yes", "--metadata", uri, "--json")
        assert deleted.returncode == 0, deleted.stderr
        assert json.loads(deleted.stdout) == {"name": "orders", "deleted_ledgers": list(remaining)}
        listed = await aiobk("log", "list", "--metadata", uri)
        assert listed.stdout == "audit\n"
        assert not set(remaining) & {i async for i in bk.list_ledgers()}


@pytest.mark.parametrize(
    ("signum", "sigint_at_start"),
    [
        (signal.SIGINT, "default_int_handler"),  # Ctrl-C at a terminal
        # A background job's: the shell made it ignore SIGINT, and Python leaves that in place
        # (a make test started in the background failed so: the follow outlived its SIGINT).
        (signal.SIGINT, "SIG_IGN"),
        (signal.SIGTERM, "default_int_handler"),
    ],
)
async def test_log_tail_follows_until_interrupted(
    etcd_cluster: Cluster, signum: int, sigint_at_start: str
) -> None:
    uri = etcd_cluster.uri
    command = [
        sys.executable, "-c",
        f"import signal; signal.signal(signal.SIGINT, signal.{sigint_at_start}); "
        "from aiobk.cli import main; main()",
    ]  # fmt: skip
    async with BookKeeper(uri) as bk:
        writer = await bk.open_log_writer("live", roll_bytes=50, record_format="raw")
        before = [await writer.append(b"before %d" % i) for i in range(3)]
        proc = subprocess.Popen(
            [*command, "log", "tail", "live", "--follow", "--metadata", uri],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:

            async def line() -> str:
                assert proc.stdout is not None
                return await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)

            assert [await line() for _ in before] == [
                f"{p}\tbefore {i}\n" for i, p in enumerate(before)
            ]
            # Live: each record shows as it is written, across the writer's rolls.
            for i in range(8):
                position = await writer.append(b"live %d" % i)
                assert await line() == f"{position}\tlive {i}\n"
            proc.send_signal(signum)
            # communicate, not wait: it drains both pipes while waiting, so a child writing much
            # to stderr (warnings on a loaded machine) cannot block on a full pipe meanwhile.
            try:
                _rest, errors = await asyncio.to_thread(proc.communicate, None, 20)
            except subprocess.TimeoutExpired:
                pytest.fail(await _why_still_running(proc))
            assert (proc.returncode, errors) == (0, "")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        await writer.close()


async def _why_still_running(proc: subprocess.Popen[str]) -> str:
    """Evidence for a child that outlived its signal: its signal dispositions, then the
    traceback a second SIGINT prints -- asyncio's runner raises KeyboardInterrupt where the main
    thread is (this is how the background job's ignored SIGINT was found)."""
    status = Path(f"/proc/{proc.pid}/status").read_text()
    signals = [line for line in status.splitlines() if line.startswith("Sig")]
    proc.send_signal(signal.SIGINT)
    try:
        _rest, errors = await asyncio.to_thread(proc.communicate, None, 10)
    except subprocess.TimeoutExpired:
        errors = "(still running 10 s after a second SIGINT)"
    return f"no exit within 20 s of its signal; {signals}; after a second SIGINT: {errors[-6000:]}"
