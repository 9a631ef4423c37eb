"""``aiobk ledger read ID | head -1`` on a big ledger: time to the first line, peak RSS.

    python -m aiobk.bench.ledger_read_head [--entries 100000] [--entry-size 1024] [--runs 3]
                                     [--src DIR ...]

Starts etcd and three bookies (processes, from this tree), writes one ledger of ``--entries``
entries and closes it, then for each ``--src`` tree (default: this one; e.g. ``--src
/tmp/before5 --src .``) runs ``aiobk ledger read ID`` from that tree ``--runs`` times, the way
``| head -1`` does: read the first line, close the pipe. Closed, the ledger reads the same
with or without recovery, so an old tree that fences by default does no harm here.

Per run, one JSON line: ``first_line_s`` (from starting the process to the first line read,
interpreter start-up included), ``exit_s`` (to the process's end: it must notice the closed
pipe), ``status``, ``peak_rss_mib`` (the aiobk process's own ``ru_maxrss`` from ``wait4``,
children excluded), ``stderr_lines`` (noise on the closed pipe). Then the median per tree,
and one whole read per tree (``mode: whole``: every line read, peak RSS over the ledger).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any


async def _write_ledger(uri: str, entries: int, size: int) -> int:
    from aiobk.client import BookKeeper

    async with BookKeeper(uri) as bk, await bk.create_ledger(3, 3, 2) as lh:
        window = 2000
        for start in range(0, entries, window):
            stop = min(start + window, entries)
            await asyncio.gather(
                *(lh.append((b"%010d" % i).ljust(size, b".")) for i in range(start, stop))
            )
        return lh.ledger_id


def measure(src: str, uri: str, ledger_id: int, whole: bool = False) -> dict[str, Any]:
    """One ``aiobk ledger read ID | head -1`` with aiobk from ``src``; with ``whole``, one
    ``aiobk ledger read ID > /dev/null`` (every line read: memory over the whole ledger)."""
    env = {**os.environ, "PYTHONPATH": src}  # cwd too: ``-c`` puts it first on sys.path
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from aiobk.cli import main; main()",
         "ledger", "read", str(ledger_id), "--metadata", uri],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=src,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    first = proc.stdout.readline()
    first_line = time.perf_counter() - started
    lines = 1
    if whole:
        lines += sum(1 for _ in proc.stdout)
    proc.stdout.close()  # what head does once it has its line
    _pid, status, usage = os.wait4(proc.pid, 0)
    ended = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    noise = proc.stderr.read().decode(errors="replace").splitlines()
    proc.stderr.close()
    return {
        "src": src,
        "mode": "whole" if whole else "head -1",
        "lines": lines,
        "first_line": first.decode(errors="replace")[:40].rstrip(),
        "first_line_s": round(first_line, 3),
        "exit_s": round(ended, 3),
        "status": proc.returncode,
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux: KiB
        "stderr_lines": len(noise),
        "stderr_last": noise[-1] if noise else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiobk.bench.ledger_read_head")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--src", action="append", default=None, help="a source tree to run aiobk from (repeat)"
    )
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources = [os.path.abspath(s) for s in args.src or [here]]

    import uvloop

    from aiobk.bench.cluster import start_bookies, stop_bookies
    from aiobk.metadata import EtcdProcess

    base = tempfile.mkdtemp(prefix="aiobk-bench-read-", dir=os.getcwd())
    etcd = EtcdProcess(data_dir=os.path.join(base, "etcd")).start()
    uri = etcd.uri("bench")
    bookies: list[subprocess.Popen[bytes]] = []
    try:
        bookies = start_bookies(3, base, uri)
        started = time.perf_counter()
        ledger_id = uvloop.run(_write_ledger(uri, args.entries, args.entry_size))
        written = {
            "ledger_id": ledger_id, "entries": args.entries, "entry_size": args.entry_size,
            "write_s": round(time.perf_counter() - started, 1),
        }  # fmt: skip
        print(json.dumps(written), flush=True)
        runs: dict[str, list[dict[str, Any]]] = {src: [] for src in sources}
        for _ in range(args.runs):
            for src in sources:  # interleaved: drift on a shared machine hits every tree
                result = measure(src, uri, ledger_id)
                runs[src].append(result)
                print(json.dumps(result), flush=True)
        for src in sources:
            print(json.dumps(measure(src, uri, ledger_id, whole=True)), flush=True)
        for src, results in runs.items():
            summary = {
                "src": src,
                "median_first_line_s": statistics.median(r["first_line_s"] for r in results),
                "median_exit_s": statistics.median(r["exit_s"] for r in results),
                "median_peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in results),
                "statuses": sorted({r["status"] for r in results}),
            }
            print(json.dumps(summary), flush=True)
    finally:
        stop_bookies(bookies)
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
