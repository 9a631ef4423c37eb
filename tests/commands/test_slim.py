"""The commands as a client-only install runs them: a server command refuses in one line
naming its extra, and the client commands print plain-text tables and progress lines (no
terminal-UI library) and simpletest's latency percentiles (no HdrHistogram)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from aiobk.cli import main as aiobk_main
from aiobk.commands import extras
from aiobk.commands.simpletest import Latencies
from aiobk.commands.text import ProgressLine, format_table


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stopped:
        aiobk_main(args)
    out, err = capsys.readouterr()
    assert isinstance(stopped.value.code, int)
    return stopped.value.code, out, err


@pytest.mark.timeout(30)
def test_a_server_command_without_its_extra_refuses_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """As on a client-only install (tests/test_packaging.py installs one for real): each
    extra here lacks a distribution, so every command that needs one refuses before any I/O."""
    absent = "aiobk-test-not-installed"
    monkeypatch.setattr(
        extras, "EXTRAS", {name: (*names, absent) for name, names in extras.EXTRAS.items()}
    )
    cases = [
        (["bookie", "start", "--data-dir", str(tmp_path)], "aiobk bookie start", "bookie"),
        (["standalone", "--bookies", "1"], "aiobk standalone", "bookie"),
        (["autorecovery", "start", "--metadata", "etcd://127.0.0.1:1/x"],
         "aiobk autorecovery start", "bookie"),
        (["bench", "add", "--bookies", "3"], "aiobk bench add", "bench"),
        (["bench", "peers", "--help"], "aiobk bench peers", "bench"),
    ]  # fmt: skip
    for args, command, extra in cases:
        code, out, err = _run(args, capsys)
        assert (code, out) == (1, ""), (args, err)
        assert err == (
            f"aiobk: error: {command} needs the {extra} extra: pip install 'aiobk[{extra}]' "
            f"(not installed: {absent})\n"
        ), args
    code, out, _err = _run(["bench", "--help"], capsys)
    assert code == 0
    assert "add           (needs the bench extra)" in out


@pytest.mark.timeout(30)
def test_the_spark_benchmark_also_needs_the_spark_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(extras, "EXTRAS", {**extras.EXTRAS, "spark": ("pyspark", "no-such")})
    code, out, err = _run(["bench", "spark"], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("aiobk: error: aiobk bench spark needs the spark extra: ")
    assert _run(["bench", "add", "--help"], capsys)[0] == 0  # its extras are installed


@pytest.mark.timeout(10)
def test_tables_align_their_columns_and_keep_each_row_on_one_line() -> None:
    text = format_table([("1", "a b\nc"), ("22", "")], ("id", "value"))
    assert text.splitlines() == ["id  value", "--  -----", "1   a b c", "22"]
    assert format_table([("ledger", "7"), ("state", "OPEN")]) == "ledger  7\nstate   OPEN"
    assert format_table([], ("a", "b")) == "a  b\n-  -"
    assert format_table([]) == ""


@pytest.mark.timeout(10)
def test_a_progress_line_is_redrawn_in_place_and_erased_at_the_end() -> None:
    screen = io.StringIO()
    with ProgressLine(screen, every=3600.0) as line:
        line.show("appending 0/10", now=True)
        line.show("appending 5/10")  # too soon after the last: not drawn
        line.note("a line that stays")
    assert screen.getvalue() == (
        "\rappending 0/10\x1b[K"
        "\r\x1b[Ka line that stays\n"
        "\rappending 5/10\x1b[K"  # redrawn under the note, as it is now
        "\r\x1b[K"
    )
    quiet = io.StringIO()
    with ProgressLine(quiet):
        pass
    assert quiet.getvalue() == ""  # never drawn: nothing to erase


@pytest.mark.timeout(10)
def test_latency_percentiles_keep_three_significant_digits() -> None:
    latencies = Latencies()
    assert latencies.percentile(50.0) == 0
    for micros in [*range(1, 100), 123_456]:
        latencies.record(micros)
    assert latencies.percentile(50.0) == 50
    assert latencies.percentile(99.0) == 99
    assert latencies.percentile(100.0) == 124_000  # rounded up: never reads low
