"""Client backpressure and read memory -- appends queued at once, megabyte appends over many
ledgers, a big range read, each in bounded memory: ``python -m bench.client_backpressure``.

Starts etcd and three bookies as processes on loopback (data under the current directory), then
runs each scenario in a fresh client process, so that its peak RSS (``VmHWM``) is its own:

- ``appends``: ``--appends`` (100,000) appends of ``--size`` (1 KiB) submitted at once to one
  ledger (E3 WQ3 AQ2), default client settings. Reports how many were acknowledged by
  ``--deadline`` (120 s), the wall time and the client CPU time (user + system).
- ``big``: ``--big-appends`` (3,000) appends of ``--big-size`` (1 MiB) submitted at once, spread
  round robin over ``--handles`` ledgers (1 and 10). Reports peak RSS growth over the RSS just
  before submitting (the payload is one shared object: what grows is the client's own).
- ``read``: writes ``--read-entries`` (300) entries of ``--big-size`` to a ledger and closes it;
  then, each in a fresh process, reads them with ``read(0, N-1)`` (the list) and with
  ``read_iter`` (consumed one by one, nothing kept). Reports peak RSS growth and time.

Before/after: run it once in a worktree of the old commit and once here, e.g.

    git worktree add /tmp/before 328e5c4 && cp bench/client_backpressure.py /tmp/before/bench/
    cd /tmp/before && PYTHONPATH=$PWD /work/main/.venv/bin/python -m aiobk.bench.client_backpressure
    cd /work/main && .venv/bin/python -m aiobk.bench.client_backpressure

(the old client has no ``read_iter``: that row says so.) ``--bookie-src DIR`` runs the bookies
from another tree, so that both clients meet the same servers; ``--only appends,big,read`` picks
scenarios; ``--json PATH`` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

MiB = 1024 * 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------- child scenarios


async def _appends(args: argparse.Namespace) -> dict[str, Any]:
    from aiobk.client import BookKeeper

    small = args.scenario == "appends"
    payload = b"x" * (args.size if small else args.big_size)
    async with await BookKeeper.connect(args.metadata) as bk:
        handles = [await bk.create_ledger(3, 3, 2) for _ in range(int(args.handles))]
        count = args.appends if small else args.big_appends
        acked = 0
        errors: dict[str, int] = {}

        def done(future: asyncio.Future[int]) -> None:
            nonlocal acked
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                acked += 1
            else:
                name = type(error).__name__
                errors[name] = errors.get(name, 0) + 1

        rss_before = _status_kib("VmRSS")
        cpu_before = _cpu()
        started = time.perf_counter()
        tasks = []
        for i in range(count):
            task = asyncio.ensure_future(handles[i % len(handles)].append(payload))
            task.add_done_callback(done)
            tasks.append(task)
        finished, _late = await asyncio.wait(tasks, timeout=args.deadline)
        elapsed = time.perf_counter() - started
        result = {
            "scenario": args.scenario,
            "appends": count,
            "size": len(payload),
            "handles": len(handles),
            "acked": acked,
            "failed": errors,
            "completed": len(finished) == count,
            "seconds": round(elapsed, 2),
            "cpu_seconds": round(_cpu() - cpu_before, 2),
            "rss_before_mib": round(rss_before / 1024, 1),
            "peak_rss_mib": round(_status_kib("VmHWM") / 1024, 1),
            "peak_growth_mib": round((_status_kib("VmHWM") - rss_before) / 1024, 1),
        }
        print(json.dumps(result), flush=True)
        os._exit(0)  # a stalled client could take minutes to wind down; the figures are out


async def _write_ledger(args: argparse.Namespace) -> dict[str, Any]:
    from aiobk.client import BookKeeper

    payload = b"r" * args.big_size
    async with await BookKeeper.connect(args.metadata) as bk:
        lh = await bk.create_ledger(3, 3, 2)
        for start in range(0, args.read_entries, 16):
            batch = range(start, min(start + 16, args.read_entries))
            await asyncio.gather(*(lh.append(payload) for _ in batch))
        await lh.close()
        return {"scenario": "write", "ledger_id": lh.ledger_id}


async def _read(args: argparse.Namespace) -> dict[str, Any]:
    from aiobk.client import BookKeeper

    async with await BookKeeper.connect(args.metadata) as bk:
        rh = await bk.open_ledger(args.ledger)
        last = rh.last_add_confirmed
        rss_before = _status_kib("VmRSS")
        started = time.perf_counter()
        count = size = 0
        outcome = "ok"
        try:
            if args.scenario == "read-list":
                entries = await rh.read(0, last)
                count, size = len(entries), sum(len(e.data) for e in entries)
                del entries
            elif not hasattr(rh, "read_iter"):
                outcome = "this client has no read_iter"
            else:
                async with contextlib.aclosing(rh.read_iter(0, last)) as stream:
                    async for entry in stream:
                        count += 1
                        size += len(entry.data)
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        return {
            "scenario": args.scenario,
            "entries": count,
            "mib": round(size / MiB, 1),
            "outcome": outcome,
            "seconds": round(time.perf_counter() - started, 2),
            "rss_before_mib": round(rss_before / 1024, 1),
            "peak_growth_mib": round((_status_kib("VmHWM") - rss_before) / 1024, 1),
        }


def _child(args: argparse.Namespace) -> None:
    import uvloop

    runner = {"appends": _appends, "big": _appends, "write": _write_ledger}.get(
        args.scenario, _read
    )
    print(json.dumps(uvloop.run(runner(args))), flush=True)


# ---------------------------------------------------------------------------- the cluster


def _run_child(scenario: str, args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "aiobk.bench.client_backpressure", "--child", "--scenario", scenario,
        "--metadata", args.metadata, "--appends", str(args.appends), "--size", str(args.size),
        "--big-appends", str(args.big_appends), "--big-size", str(args.big_size),
        "--read-entries", str(args.read_entries), "--deadline", str(args.deadline), *extra,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=args.deadline + 300, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"scenario": scenario, "error": done.stderr.strip().splitlines()[-3:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiobk.bench.client_backpressure")
    parser.add_argument("--appends", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--big-appends", type=int, default=3_000)
    parser.add_argument("--big-size", type=int, default=MiB)
    parser.add_argument("--handles", default="1,10", help="ledgers the big appends spread over")
    parser.add_argument("--read-entries", type=int, default=300)
    parser.add_argument("--deadline", type=float, default=120.0)
    parser.add_argument("--only", default="appends,big,read")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--bookie-src", default=None, help="run the bookies from this source tree (PYTHONPATH)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", default="", help=argparse.SUPPRESS)
    parser.add_argument("--metadata", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ledger", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0

    from aiobk.bench.cluster import start_bookies, stop_bookies
    from aiobk.metadata import EtcdProcess

    base = tempfile.mkdtemp(prefix="aiobk-bench-bp-", dir=os.getcwd())
    etcd = EtcdProcess(data_dir=os.path.join(base, "etcd")).start()
    args.metadata = etcd.uri("bench")
    bookies: list[subprocess.Popen[bytes]] = []
    results: list[dict[str, Any]] = []
    try:
        bookies = start_bookies(3, base, args.metadata, source=args.bookie_src)
        only = set(args.only.split(","))
        if "appends" in only:
            results.append(_run_child("appends", args, "--handles", "1"))
            print(json.dumps(results[-1]), flush=True)
        if "big" in only:
            for handles in args.handles.split(","):
                results.append(_run_child("big", args, "--handles", handles))
                print(json.dumps(results[-1]), flush=True)
        if "read" in only:
            written = _run_child("write", args)
            print(json.dumps(written), flush=True)
            ledger = str(written.get("ledger_id", -1))
            for scenario in ("read-list", "read-iter"):
                results.append(_run_child(scenario, args, "--ledger", ledger))
                print(json.dumps(results[-1]), flush=True)
    finally:
        stop_bookies(bookies)
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"python": sys.version, "results": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
