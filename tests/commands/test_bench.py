"""The benchmarks' command lines: ``aiobk bench NAME --help`` lists the options of
``python -m aiobk.bench.NAME --help``, and a missed target is reported in the last line, exit 0."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiobk.bench import add as bench_add
from aiobk.bench.add import Floors, Level
from aiobk.bench.targets import summary
from aiobk.cli import main as aiobk_main
from tests.support.wait import wait_until_sync

EXPECTED_OPTIONS = {
    "add": {
        "--bookies", "--seconds", "--entry-size", "--in-flight", "--json", "--modes",
        "--durability", "--no-journal-write-data", "--fail-on-miss", "--log-level",
        "--entries", "--metadata",
    },
    "journal": {
        "--seconds", "--entry-size", "--in-flight", "--durability", "--rates",
        "--journal-alignment", "--data-dir", "--json", "--fail-on-miss", "--log-level",
    },
    "autorecovery": {
        "--megabytes", "--entry-size", "--ledgers", "--bookies", "--workers", "--in-flight",
        "--throttle", "--timeout", "--dir", "--json", "--cprofile", "--fail-on-miss",
        "--log-level",
    },
    "metadata": {"--count", "--json", "--log-level"},
    "peers": {
        "--seconds", "--entry-size", "--in-flight", "--rates", "--rate-of-nats", "--systems",
        "--json", "--plot", "--fail-on-miss", "--log-level",
    },
    "spark": {"--records", "--size", "--json", "--log-level"},
    "offload": {
        "--records", "--size", "--no-targets", "--json", "--fail-on-miss", "--log-level",
    },
}  # fmt: skip


def _help(*command: str) -> str:
    result = subprocess.run(
        [sys.executable, *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _options(text: str) -> set[str]:
    return set(re.findall(r"^\s+(--[a-z][a-z-]*)", text, re.MULTILINE)) - {"--help"}


@pytest.mark.parametrize("name", sorted(EXPECTED_OPTIONS))
def test_aiobk_bench_help_lists_the_module_options(name: str) -> None:
    through_aiobk = _help("-m", "aiobk", "bench", name)
    through_module = _help("-m", f"aiobk.bench.{name}")
    assert _options(through_aiobk) == EXPECTED_OPTIONS[name]
    assert _options(through_module) == EXPECTED_OPTIONS[name]
    assert f"Usage: aiobk bench {name} [OPTIONS]" in through_aiobk


def _level(in_flight: int, p50_us: int, appends_per_s: float) -> Level:
    return Level("persistent", in_flight, 1000, 1.0, appends_per_s, p50_us, p50_us, p50_us, 0)


@pytest.mark.parametrize(
    ("p50_us", "rate", "flags", "code", "last_line"),
    [
        (5000, 900.0, [], 0, "2 of 2 targets missed (a benchmark reports, it does not fail)"),
        (5000, 20000.0, [], 0, "1 of 2 targets missed (a benchmark reports, it does not fail)"),
        (5000, 900.0, ["--fail-on-miss"], 1, "2 of 2 targets missed (--fail-on-miss: exit 1)"),
        (150, 20000.0, ["--fail-on-miss"], 0, "all 2 targets met"),
    ],
)
def test_bench_add_ends_with_the_targets_missed_and_exits_0(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    p50_us: int,
    rate: float,
    flags: list[str],
    code: int,
    last_line: str,
) -> None:
    """The measurement itself is replaced (it takes processes and seconds); the report,
    the targets and the exit code are the real ones."""
    floors = Floors(fdatasync_us=100, loopback_rtt_us=20, quorum_fdatasync_us=200)
    canned = [_level(1, p50_us, 500.0), _level(512, 40_000, rate)]
    seen: list[tuple[int, float, int, list[int], list[str]]] = []

    def fake_measure(
        bookies: int,
        seconds: float,
        entry_size: int,
        levels: list[int],
        modes: list[str],
        entries: int = 0,
    ) -> tuple[Floors, list[Level]]:
        seen.append((bookies, seconds, entry_size, levels, modes))
        return floors, canned

    monkeypatch.setattr(bench_add, "measure", fake_measure)
    monkeypatch.delenv("AIOBK_METADATA", raising=False)  # the local run, not a cluster's
    argv = ["bench", "add", "--in-flight", "1,512", "--seconds", "0.5", "--json"]
    with pytest.raises(SystemExit) as exited:
        aiobk_main([*argv, str(tmp_path / "add.json"), *flags])
    assert exited.value.code == code
    assert seen == [(3, 0.5, 1024, [1, 512], ["persistent"])]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[-1] == last_line
    assert (tmp_path / "add.json").exists()


def test_each_sequenced_level_is_paired_with_the_plain_log_level_before_it() -> None:
    def level(mode: str, in_flight: int, rate: float, p50_us: int) -> Level:
        return Level(mode, in_flight, 1000, 1.0, rate, p50_us, p50_us, p50_us, 0)

    results = [
        level("log", 1, 500.0, 1000), level("log", 512, 10000.0, 40000),
        level("log-producer", 1, 450.0, 1100), level("log-producer", 512, 9700.0, 41000),
        level("log-producer", 512, 9000.0, 42000),  # no log level before it left: unpaired
        level("log", 512, 8000.0, 50000), level("log-producer", 512, 8000.0, 50000),
    ]  # fmt: skip
    pairs = bench_add.producer_pairs(results)
    assert [(p["in_flight"], p["ratio"], p["p50_ratio"]) for p in pairs] == [
        (1, 0.9, 1.1), (512, 0.97, 1.025), (512, 1.0, 1.0),
    ]  # fmt: skip
    (check,) = bench_add.check_producer_cost(pairs)
    assert (check["median"], check["pairs"], check["range"], check["pass"]) == (
        0.985, 2, [0.97, 1.0], True,
    )  # fmt: skip
    assert bench_add.check_producer_cost(pairs[:1]) == []  # judged at 512 in flight only
    assert bench_add._modes("log,log-producer,log", None, False) == [
        "log", "log-producer", "log",
    ]  # fmt: skip


def test_summary_without_targets() -> None:
    assert summary([]) == "no target checked at these in-flight levels"
    assert summary([{"target": "t", "pass": True}]) == "the target was met"


def test_bad_in_flight_is_a_one_line_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aiobk.bench.add", "--in-flight", "1,x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "python -m aiobk.bench.add: error: Invalid value for '--in-flight': expected a comma list "
        "of integers, got '1,x'"
    ]


@pytest.mark.timeout(180)
def test_the_index_engine_comparison_runs_and_checks_crash_safety(tmp_path: Path) -> None:
    """A small run of ``aiobk bench index``: both engines load, look up, delete ranges, scan,
    survive a SIGKILL mid-write with every durable batch whole, and the result is written."""
    result = subprocess.run(
        [sys.executable, "-m", "aiobk.bench.index_engines", "--ledgers", "300", "--entries",
         "3", "--lookups", "100", "--deletes", "10", "--batch", "200"],
        cwd=tmp_path, capture_output=True, text=True, timeout=170, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "LOST A DURABLE BATCH" not in result.stdout
    assert result.stdout.count("every durable batch whole") == 2
    (written,) = (tmp_path / "bench" / "results").iterdir()
    figures = json.loads(written.read_text())
    assert figures["rocksdb"]["keys"] == figures["lmdb"]["keys"] == 900


@pytest.mark.timeout(90)
def test_the_rereplication_benchmark_runs_and_copies_every_entry(tmp_path: Path) -> None:
    """A small run of ``aiobk bench autorecovery``: a bookie is lost, every entry it held is
    copied again, the ratio against the disk floor is reported and the result written."""
    result = subprocess.run(
        [sys.executable, "-m", "aiobk", "bench", "autorecovery", "--megabytes", "2",
         "--entry-size", "65536", "--ledgers", "2", "--timeout", "60"],
        cwd=tmp_path, capture_output=True, text=True, timeout=85, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (written,) = (tmp_path / "bench" / "results").iterdir()
    (run,) = json.loads(written.read_text())["runs"]
    assert run["entries_replicated"] == run["lost_entries"] > 0
    assert run["bytes_replicated"] == run["lost_bytes"]
    assert run["still_naming_lost"] == run["marks_left"] == 0
    assert run["ratio"] > 0
    assert result.stdout.splitlines()[-1] in (
        "the target was met",
        "1 of 1 target missed (a benchmark reports, it does not fail)",
    )


@pytest.mark.timeout(240)
def test_the_offload_benchmark_offloads_and_reads_every_record_back(tmp_path: Path) -> None:
    """A tiny run of ``aiobk bench offload``: every record read by Spark from the bookies,
    offloaded and released, then read by Spark from the store; no target judged."""
    report = tmp_path / "offload.json"
    result = subprocess.run(
        [sys.executable, "-m", "aiobk", "bench", "offload", "--records", "300", "--size", "100",
         "--no-targets", "--json", str(report)],
        cwd=tmp_path, capture_output=True, text=True, timeout=220, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(report.read_text())
    assert figures["records"] == 300
    assert figures["ledgers released"] >= 1
    assert figures["offload bytes"] > 300 * 100
    assert figures["Spark bookies rows/s"] > 0
    assert figures["Spark store rows/s"] > 0
    assert figures["checks"] == []


@pytest.mark.timeout(150)
def test_the_peers_comparison_runs_every_system_and_writes_json_and_a_plot(
    tmp_path: Path,
) -> None:
    """A short run of ``aiobk bench peers``: every server is started and stopped by the
    benchmark, every system has figures in the closed and the open loop, and the result and
    the plot are written."""
    result = subprocess.run(
        [sys.executable, "-m", "aiobk", "bench", "peers", "--seconds", "0.5", "--in-flight",
         "1,8", "--rates", "100", "--rate-of-nats", "", "--json", str(tmp_path / "p.json"),
         "--plot", str(tmp_path / "p.png")],
        cwd=tmp_path, capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "p.json").read_text())
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    systems = {s["key"] for s in report["systems"]}
    assert systems == {
        "nats", "aiobk-persistent", "aiobk-pure", "aiobk-volatile", "etcd-3", "etcd-1", "redis"
    }  # fmt: skip
    for key in systems:
        closed = {r["in_flight"]: r for r in report["runs"] if r["system"] == key
                  and r["loop"] == "closed"}  # fmt: skip
        opened = [r for r in report["runs"] if r["system"] == key and r["loop"] == "open"]
        assert len(opened) == (0 if key == "aiobk-pure" else 1), key  # a child's: closed only
        assert sorted(closed) == [1, 8], key
        for run in [*closed.values(), *opened]:
            assert run["ops"] > 0, (key, run)
            assert run["errors"] == 0, (key, run)
            assert run["p50_us"] > 0, (key, run)
            assert run["cdf"], (key, run)
        assert closed[8]["cpu_client_us"] > 0, key
        assert closed[1]["quorum_floor_us"] > 0, key  # measured beside the 1-in-flight level
        assert closed[8]["quorum_floor_us"] == 0, key
        assert closed[8]["cpu_servers_us"] > 0, key
        assert 0 <= closed[8]["cpu_servers_system_us"] <= closed[8]["cpu_servers_us"], key
        for run in opened:
            assert (run["offered_per_s"], run["unfinished"]) == (100, 0), key
    assert report["floors"]["quorum_floor_us"] > 0
    assert report["compiled"] is True  # the pure runs' child chose otherwise (``child_runs``)
    assert [c["target"] for c in report["checks"]] == [
        "1 in flight: aiobk persistent p50 <= 1.5x quorum floor",
        "1 in flight: aiobk persistent p50 <= NATS p50 (it does not fsync)",
        "1 in flight: aiobk volatile p50 <= 0.8x NATS p50",
    ]
    assert list((tmp_path).glob("aiobk-bench-*")) == []  # the temporary directories are gone


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _ignored_signals(pid: int) -> list[int]:
    """The signals ``pid`` ignores (SigIgn in /proc), for a failure's message."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigIgn:"):
                mask = int(line.split()[1], 16)
                return [n for n in range(1, 65) if mask >> (n - 1) & 1]
    return []


@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_peers_stops_every_server_on_ctrl_c_and_sigterm(tmp_path: Path, signum: int) -> None:
    """Interrupted while etcd and three bookies run (SIGTERM as Ctrl-C: an exception raised
    in a signal handler could land in a transport callback and be swallowed there), the
    benchmark stops them all and removes its directory before it exits."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiobk", "bench", "peers", "--systems", "aiobk-persistent",
         "--seconds", "30", "--in-flight", "1", "--rates", "", "--rate-of-nats", ""],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        servers: set[int] = set()

        def all_up() -> bool:
            servers.clear()
            servers.update(pid for pid in _children(proc.pid) if _alive(pid))
            return len(servers) >= 4  # etcd and 3 bookies

        wait_until_sync(all_up, timeout=60, every=0.2, what=lambda: f"4 servers: {servers}")
        time.sleep(4)  # the last bookie serving, the warm-up done: in the measured level
        ignored = _ignored_signals(proc.pid)
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, (err, f"signals the benchmark ignored: {ignored}")
    left = {pid: _cmdline(pid) for pid in servers if _alive(pid)}
    assert left == {}, err
    assert list(tmp_path.glob("aiobk-bench-*")) == []
