"""Every long-running command takes ``--log-level``, the bookie's TOML
``log_level`` too; and a reader that stops reading is not an error for any command."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.procs import BookieProcess


async def _stderr_of_a_bookie(tmp_path: Path, *args: str, toml: str | None = None) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    extra = list(args)
    if toml is not None:
        config = tmp_path / "bookie.toml"
        config.write_text(toml)
        extra += ["--config", str(config)]
    bookie = BookieProcess(tmp_path / "b", None, *extra)
    await bookie.start()
    assert bookie.terminate() == 0
    return bookie.log_path.read_text()


@pytest.mark.timeout(60)
async def test_bookie_start_log_level_flag_and_toml(tmp_path: Path) -> None:
    assert " INFO aiobk.bookie.server " in await _stderr_of_a_bookie(tmp_path / "default")
    quiet = await _stderr_of_a_bookie(tmp_path / "flag", "--log-level", "warning")
    assert " INFO " not in quiet
    from_toml = await _stderr_of_a_bookie(tmp_path / "toml", toml='log_level = "warning"\n')
    assert " INFO " not in from_toml
    # The flag wins over the file.
    both = await _stderr_of_a_bookie(
        tmp_path / "both", "--log-level", "debug", toml='log_level = "warning"\n'
    )
    assert " INFO aiobk.bookie.server " in both


def _aiobk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiobk", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        ["standalone"],
        ["simpletest"],
        ["log", "tail", "x"],
        ["bench", "add"],
        ["bookie", "start"],
    ],
)
def test_long_running_commands_take_log_level(command: list[str]) -> None:
    shown = _aiobk(*command, "--help")
    assert shown.returncode == 0, shown.stderr
    assert "--log-level" in shown.stdout
    refused = _aiobk(*command, "--log-level", "chatty")
    assert refused.returncode == 2
    assert "--log-level" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1  # one line, no usage dump


def test_a_bad_log_level_in_the_toml_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bookie.toml"
    config.write_text(f'data_dir = "{tmp_path}"\nlog_level = "loud"\n')
    run = _aiobk("bookie", "start", "--config", str(config))
    assert run.returncode == 2
    assert "log_level must be debug, info, warning or error" in run.stderr


@pytest.mark.timeout(60)
def test_a_closed_pipe_ends_any_command_quietly() -> None:
    program = textwrap.dedent(
        """
        import click
        from aiobk.commands.common import QuietPipeGroup, run_group

        @click.group(cls=QuietPipeGroup)
        def group() -> None:
            pass

        @group.command()
        def chatty() -> None:
            for _ in range(200_000):  # far more than a pipe holds
                click.echo("x" * 100)

        run_group(group, "prog", ["chatty"])
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None
    assert process.stderr is not None
    assert process.stdout.readline().startswith(b"xxx")
    process.stdout.close()  # as `| head -1` does
    assert process.wait(30) == 0
    assert process.stderr.read() == b""  # no traceback, no "Exception ignored"
    process.stderr.close()
