"""Choosing the engine of the bookie's on-disk index: RocksDB (rocksdict, what
BookKeeper's DbLedgerStorage uses) against LMDB (lmdb), on the index's own work.

The index maps (ledger id, entry id) -> entry-log location: 16-byte big-endian keys (so one
ledger's entries are one key range, in order) and 8-byte values. Each engine runs in a child
process of its own (so its memory is measured alone) and does, with the bookie's durability:

- **load**: ``--ledgers`` x ``--entries`` keys in checkpoint-sized batches of ``--batch`` keys,
  each batch one atomic write made durable before the next (a checkpoint);
- **lookups**: ``--lookups`` random point lookups after reopening (cold for the engine: its
  own caches are empty, the OS page cache is not), then the same again (warm); per-lookup
  latency percentiles;
- **range delete**: one ledger's keys at a time, for ``--deletes`` ledgers (garbage collection);
- **scan**: every ledger id, by seeking past each ledger's range (GC's iteration);
- **crash**: a writer is killed (SIGKILL) while committing batches; on reopen every batch it
  reported durable must be there, whole, and the engine must open without repair;
- bytes on disk after the load, and how much the child's resident memory grew (an LMDB map's
  pages count once touched; RocksDB holds its block cache, ``--cache``, and write buffers).

The figures are reported next to each other (ratios RocksDB / LMDB): the machine is shared and
noisy, so only a comparison within one run means anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import click
from rich.console import Console
from rich.table import Table

from aiobk.bench.resources import disk_bytes, rss_mib
from aiobk.bench.targets import dir_option, entries_option, module_main, write_report
from aiobk.bookie.index.engine import IndexBatch

KEY = struct.Struct(">QQ")  # ledger id, entry id: one ledger's entries are one ordered range
VALUE = struct.Struct(">q")  # entry-log location
ENGINES = ("rocksdb", "lmdb")


class Engine(Protocol):
    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None: ...  # atomic, durable
    def get(self, key: bytes) -> bytes | None: ...
    def delete_range(self, start: bytes, end: bytes) -> None: ...  # durable
    def seek(self, key: bytes) -> bytes | None: ...  # the first key >= key
    def close(self) -> None: ...


class Rocks:
    """The bookie's own engine (``bookie.index.rocks``), configured as the bookie runs it."""

    def __init__(self, path: str, cache_bytes: int) -> None:
        from aiobk.bookie.index.rocks import RocksIndexDb

        self._db = RocksIndexDb(path, cache_bytes=cache_bytes)

    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        batch = IndexBatch()
        for key, value in items:
            batch.put(key, value)
        self._db.write_now(batch)

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def delete_range(self, start: bytes, end: bytes) -> None:
        batch = IndexBatch()
        batch.delete_range(start, end)
        self._db.write_now(batch)

    def seek(self, key: bytes) -> bytes | None:
        return next((found for found, _value in self._db.scan(key, b"\xff" * 17)), None)

    def close(self) -> None:
        self._db.close_now()


class Lmdb:
    def __init__(self, path: str, cache_bytes: int) -> None:
        import lmdb

        # The map is address space, not memory; the page cache is the OS's (cache_bytes unused).
        self._env = lmdb.open(path, map_size=64 << 30, sync=True, metasync=True, readahead=False)

    def write_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        with self._env.begin(write=True) as txn:
            for key, value in items:
                txn.put(key, value)

    def get(self, key: bytes) -> bytes | None:
        with self._env.begin() as txn:
            value = txn.get(key)
        return value if value is None else bytes(value)

    def delete_range(self, start: bytes, end: bytes) -> None:
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor()
            if cursor.set_range(start):
                while cursor.key() < end and cursor.delete():
                    pass

    def seek(self, key: bytes) -> bytes | None:
        with self._env.begin() as txn:
            cursor = txn.cursor()
            return bytes(cursor.key()) if cursor.set_range(key) else None

    def close(self) -> None:
        self._env.close()


def open_engine(name: str, path: str, cache_bytes: int) -> Engine:
    return Rocks(path, cache_bytes) if name == "rocksdb" else Lmdb(path, cache_bytes)


def _batches(ledgers: int, entries: int, size: int) -> Iterator[list[tuple[bytes, bytes]]]:
    batch: list[tuple[bytes, bytes]] = []
    for ledger in range(ledgers):
        for entry in range(entries):
            batch.append((KEY.pack(ledger, entry), VALUE.pack((ledger << 20) + entry)))
            if len(batch) == size:
                yield batch
                batch = []
    if batch:
        yield batch


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6, 1)

    return {"p50_us": pick(0.5), "p99_us": pick(0.99)}


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def measure(name: str, path: str, args: dict[str, Any]) -> dict[str, Any]:
    """One engine's figures (runs in a child process)."""
    ledgers, entries, cache = args["ledgers"], args["entries"], args["cache"]
    rng = random.Random(args["seed"])
    idle = rss_mib()
    engine = open_engine(name, path, cache)
    load = 0.0
    count = 0
    for batch in _batches(ledgers, entries, args["batch"]):  # generated as it goes: not counted
        load += _timed(lambda b=batch: engine.write_batch(b))  # type: ignore[misc]
        count += 1
    loaded = rss_mib() - idle
    engine.close()
    result: dict[str, Any] = {
        "keys": ledgers * entries,
        "load_keys_per_s": round(ledgers * entries / load),
        "checkpoint_batch_ms": round(load / count * 1000, 2),
        "disk_bytes_per_key": round(disk_bytes(path) / (ledgers * entries), 1),
        "rss_after_load_mib": round(loaded, 1),
    }
    engine = open_engine(name, path, cache)
    keys = [
        KEY.pack(rng.randrange(ledgers), rng.randrange(entries)) for _ in range(args["lookups"])
    ]
    for phase in ("cold", "warm"):
        samples = []
        for key in keys:
            start = time.perf_counter()
            found = engine.get(key)
            samples.append(time.perf_counter() - start)
            assert found is not None
        result[f"lookup_{phase}"] = _percentiles(samples)
    doomed = rng.sample(range(ledgers), min(args["deletes"], ledgers))
    spent = sum(
        _timed(lambda i=i: engine.delete_range(KEY.pack(i, 0), KEY.pack(i + 1, 0)))  # type: ignore[misc]
        for i in doomed
    )
    result["range_delete_ms"] = round(spent / len(doomed) * 1000, 3)
    assert engine.get(KEY.pack(doomed[0], 0)) is None
    found_ledgers = 0
    start = time.perf_counter()
    at = engine.seek(KEY.pack(0, 0))
    while at is not None:
        found_ledgers += 1
        at = engine.seek(KEY.pack(KEY.unpack(at)[0] + 1, 0))
    result["scan_ledgers_per_s"] = round(found_ledgers / (time.perf_counter() - start))
    assert found_ledgers == ledgers - len(doomed)
    engine.close()
    result["rss_after_all_mib"] = round(rss_mib() - idle, 1)
    return result


def crash_writer(name: str, path: str, batch: int) -> None:
    """Child: commit batches forever, printing each batch number once it is durable."""
    engine = open_engine(name, path, 8 << 20)
    number = 0
    while True:
        engine.write_batch([(KEY.pack(number, e), VALUE.pack(e)) for e in range(batch)])
        print(number, flush=True)
        number += 1


def crash_check(name: str, root: str, batch: int, after: int) -> dict[str, Any]:
    """Kill a writer after ``after`` durable batches; every one of them must be whole."""
    path = os.path.join(root, f"crash-{name}")
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiobk.bench.index_engines",
            "--crash-child",
            name,
            path,
            str(batch),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    durable = -1
    for line in child.stdout:
        durable = int(line)
        if durable + 1 >= after:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    engine = open_engine(name, path, 8 << 20)
    whole = all(
        engine.get(KEY.pack(n, 0)) is not None and engine.get(KEY.pack(n, batch - 1)) is not None
        for n in range(durable + 1)
    )
    torn = engine.get(KEY.pack(durable + 1, 0)) is not None and (
        engine.get(KEY.pack(durable + 1, batch - 1)) is None
    )
    engine.close()
    return {"durable_batches": durable + 1, "all_durable_whole": whole, "torn_batch": torn}


@click.command(
    "index",
    help=__doc__,
    short_help="RocksDB against LMDB on the bookie index's own work.",
)
@click.option(
    "--ledgers", type=click.IntRange(min=10), default=100_000, show_default=True,
    help="Ledgers loaded.",
)  # fmt: skip
@entries_option()
@click.option(
    "--batch", type=click.IntRange(min=1), default=20_000, show_default=True,
    help="Keys per durable batch (a checkpoint).",
)  # fmt: skip
@click.option(
    "--lookups", type=click.IntRange(min=100), default=20_000, show_default=True,
    help="Random point lookups, cold then warm.",
)  # fmt: skip
@click.option(
    "--deletes", type=click.IntRange(min=1), default=1_000, show_default=True,
    help="Ledgers range-deleted (garbage collection).",
)  # fmt: skip
@click.option(
    "--cache", type=click.IntRange(min=1 << 20), default=64 << 20, show_default=True,
    help="RocksDB's block cache in bytes.",
)  # fmt: skip
@dir_option("the engines' files")
def command(
    ledgers: int,
    entries: int,
    batch: int,
    lookups: int,
    deletes: int,
    cache: int,
    directory: str | None,
) -> None:
    args = {
        "ledgers": ledgers, "entries": entries, "batch": batch, "lookups": lookups,
        "deletes": deletes, "cache": cache, "seed": 1,
    }  # fmt: skip
    root = tempfile.mkdtemp(prefix="aiobk-index-", dir=directory)
    results: dict[str, Any] = {"args": args}
    try:
        for name in ENGINES:
            out = subprocess.run(
                [sys.executable, "-m", "aiobk.bench.index_engines", "--child", name, root,
                 json.dumps(args)],
                capture_output=True, text=True, timeout=1800, check=True,
            )  # fmt: skip
            results[name] = json.loads(out.stdout)
            results[name]["crash"] = crash_check(name, root, 1000, 20)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _report(results)


def _report(results: dict[str, Any]) -> None:
    rocks, lmdb = results["rocksdb"], results["lmdb"]
    rows = [
        ("load, keys/s (durable batches)", "load_keys_per_s"),
        ("one checkpoint batch, ms", "checkpoint_batch_ms"),
        ("disk bytes per key", "disk_bytes_per_key"),
        ("cold lookup p50, us", ("lookup_cold", "p50_us")),
        ("cold lookup p99, us", ("lookup_cold", "p99_us")),
        ("warm lookup p50, us", ("lookup_warm", "p50_us")),
        ("range delete of a ledger, ms", "range_delete_ms"),
        ("scan, ledgers/s", "scan_ledgers_per_s"),
        ("RSS growth after the load, MiB", "rss_after_load_mib"),
        ("RSS growth after lookups, deletes, scan, MiB", "rss_after_all_mib"),
    ]
    table = Table(title=f"index engines, {rocks['keys']:,} keys")
    for column in ("", "RocksDB", "LMDB", "RocksDB / LMDB"):
        table.add_column(column, justify="right")
    for label, field in rows:
        a = rocks[field[0]][field[1]] if isinstance(field, tuple) else rocks[field]
        b = lmdb[field[0]][field[1]] if isinstance(field, tuple) else lmdb[field]
        table.add_row(label, f"{a:,}", f"{b:,}", f"{a / b:.2f}" if b else "-")
    for name, found in (("RocksDB", rocks), ("LMDB", lmdb)):
        crash = found["crash"]
        table.add_row(
            f"{name} kill -9 while writing",
            "every durable batch whole" if crash["all_durable_whole"] else "LOST A DURABLE BATCH",
            "a torn batch seen" if crash["torn_batch"] else "no torn batch",
            f"{crash['durable_batches']} batches",
        )
    Console(width=110).print(table)
    path = write_report("index-engines", results, None)
    print(f"wrote {path}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _flag, name, root, args = sys.argv[1:5]
        path = os.path.join(root, name)
        print(json.dumps(measure(name, path, json.loads(args))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--crash-child":
        with contextlib.suppress(BrokenPipeError):
            crash_writer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    module_main(command, "index_engines")()


if __name__ == "__main__":
    main()
