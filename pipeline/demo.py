"""``make pipeline-demo``: a log of JSON events, aggregated with Spark, written as Parquet.

1. Starts a standalone cluster (``aiobk standalone``: etcd + 3 bookies on free loopback ports,
   data in a temporary directory) unless ``--metadata URI`` names a running one.
2. Appends N JSON events (``{"user": ..., "kind": ..., "amount": ...}``) to the log ``events``.
3. Reads the log with ``spark.read.format("aiobk")``, parses the JSON, sums amounts per kind,
   writes the result as Parquet and prints it.

    python -m aiobk.pipeline.demo --events 5000 --out demo-output
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time

from aiobk.client import BookKeeper
from aiobk.metadata import free_port
from aiobk.pipeline.source import local_session

KINDS = ("view", "click", "purchase", "refund")


def start_standalone(data_dir: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "aiobk", "standalone", "--bookies", "3", "--data-dir", data_dir,
         "--etcd-port", str(port), "--bookie-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    uri = ""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith("metadata: "):
            uri = line.split(": ", 1)[1].strip()
        if "cluster ready" in line:
            return process, uri
    process.kill()
    raise SystemExit(f"the standalone cluster did not start (last line: {line!r})")


async def write_events(uri: str, count: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    totals: dict[str, float] = {}
    async with await BookKeeper.connect(uri) as bk:
        writer = await bk.open_log_writer("events")
        appends = []
        for i in range(count):
            kind = rng.choice(KINDS)
            amount = round(rng.uniform(1, 100), 2)
            totals[kind] = totals.get(kind, 0.0) + amount
            event = {"id": i, "user": f"u{rng.randrange(100)}", "kind": kind, "amount": amount}
            appends.append(writer.append(json.dumps(event).encode()))
        await asyncio.gather(*appends)
        await writer.close()
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m aiobk.pipeline.demo")
    parser.add_argument("--metadata", help="a running cluster's metadata URI")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--out", default="demo-output", help="Parquet output directory")
    args = parser.parse_args()
    cluster = None
    data_dir = tempfile.mkdtemp(prefix="aiobk-demo-")
    try:
        uri = args.metadata
        if not uri:
            cluster, uri = start_standalone(data_dir)
            print(f"standalone cluster at {uri}")
        expected = asyncio.run(write_events(uri, args.events, seed=1))
        print(f"appended {args.events} events to the log 'events'")

        from pyspark.sql import functions as F  # noqa: PLC0415 - Spark's own idiom

        spark = local_session("aiobk-demo")
        try:
            schema = "id long, user string, kind string, amount double"
            events = (
                spark.read.format("aiobk").option("metadata", uri).option("log", "events").load()
                .select(F.from_json(F.col("data").cast("string"), schema).alias("e"))
                .select("e.*")
            )  # fmt: skip
            totals = events.groupBy("kind").agg(
                F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("amount")
            )
            totals.write.mode("overwrite").parquet(args.out)
            result = spark.read.parquet(args.out).orderBy("kind").collect()
        finally:
            spark.stop()
        print(f"{'kind':<10}{'events':>8}{'amount':>12}")
        for row in result:
            print(f"{row.kind:<10}{row.events:>8}{row.amount:>12.2f}")
        total = sum(row.events for row in result)
        ok = total == args.events and all(
            abs(row.amount - expected[row.kind]) < 0.01 * max(1, row.events) for row in result
        )
        print(
            f"wrote {args.out}/ (Parquet); {total} events aggregated: {'OK' if ok else 'MISMATCH'}"
        )
        return 0 if ok else 1
    finally:
        if cluster is not None:
            cluster.terminate()
            cluster.wait(30)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
