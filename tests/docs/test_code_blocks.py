"""The documentation site's code runs as written: a reader copying any block gets what it says.

One cluster is started the way the getting-started page starts one (``aiobk standalone``), on
free ports, with ``AIOBK_METADATA`` pointing at it. Then:

- every ``python`` block of every page runs as a script, unchanged, and must exit 0 (blocks
  run in page order, then line order; each is written to stand alone);
- every ``aiobk`` line of an ``sh`` block runs with the example addresses swapped for the test
  cluster's and must exit 0 (a ``bookie start`` must serve, then stop cleanly on SIGTERM);
- every ``toml`` block is a valid bookie configuration (every key a ``BookieConfig`` setting);
- every ``ini`` block that names its unit file (``# .../NAME.service`` on its first line)
  passes ``systemd-analyze verify``.

Blocks that only show a synopsis or another host's commands are ``text``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiobk.bookie import BookieConfig
from aiobk.metadata import free_port
from tests.docs.blocks import Block, blocks, shell_commands
from tests.support.standalone_cluster import Standalone, adapted, standalone_cluster, start_and_stop


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    with standalone_cluster(tmp_path_factory.mktemp("docs")) as running:
        yield running


def _id(block: Block) -> str:
    return block.where


def test_the_pages_have_runnable_examples() -> None:
    assert len(blocks("python")) >= 5
    assert shell_commands()


# The Spark guide's block starts a JVM and runs five jobs: about 100 s alone, more on a machine
# busy with the rest of the suite.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", blocks("python"), ids=_id)
def test_python_block_runs_as_written(cluster: Standalone, block: Block) -> None:
    run = subprocess.run(
        [sys.executable, "-c", block.code],
        env=cluster.env, cwd=cluster.root, capture_output=True, text=True, timeout=560,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, f"{block.where}:\n{run.stderr[-3000:]}"


@pytest.mark.timeout(300)
def test_shell_commands_run_as_written(cluster: Standalone) -> None:
    port = free_port()
    for where, command in shell_commands():
        argv = adapted(command, cluster, port)
        if argv[3:5] == ["bookie", "start"]:
            start_and_stop(argv, cluster, where)
            continue
        run = subprocess.run(
            argv, env=cluster.env, cwd=cluster.root, capture_output=True, text=True,
            timeout=120, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert run.returncode == 0, f"{where}: {command}\n{run.stderr[-2000:]}"


@pytest.mark.parametrize("block", blocks("toml"), ids=_id)
def test_toml_block_is_a_bookie_configuration(block: Block) -> None:
    table = tomllib.loads(block.code)
    table = table.get("bookie", table)
    table.setdefault("data_dir", "/var/lib/aiobk/data")
    BookieConfig.from_mapping(table, source=block.where)


UNIT_NAME = re.compile(r"^# \S*/([\w.@-]+\.service)\b")


def _units() -> list[Block]:
    return [b for b in blocks("ini") if UNIT_NAME.match(b.code)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", _units(), ids=_id)
def test_systemd_unit_block_verifies(block: Block, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze is not on PATH; `make setup` installs systemd"
    match = UNIT_NAME.match(block.code)
    assert match is not None
    path = tmp_path / match.group(1)
    path.write_text(block.code)
    done = subprocess.run(
        [analyze, "verify", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    complaints = [line for line in output.splitlines() if path.name in line]
    assert not complaints, "\n".join(complaints)


def _etcd_env_blocks() -> list[Block]:
    return [b for b in blocks("ini") if re.match(r"^# \S*/etcd\.env\b", b.code)]


def test_the_etcd_settings_are_flags_etcd_takes() -> None:
    found = _etcd_env_blocks()
    assert found, "the cluster page shows an etcd member's settings"
    etcd = shutil.which("etcd")
    assert etcd is not None, "etcd is not on PATH; `make setup` installs it"
    usage = subprocess.run(
        [etcd, "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    flags = set(re.findall(r"--([a-z0-9-]+)", usage.stdout + usage.stderr))
    for block in found:
        for line in block.code.splitlines():
            if not line or line.startswith("#"):
                continue
            name = line.split("=", 1)[0]
            assert name.startswith("ETCD_"), f"{block.where}: {line}"
            flag = name.removeprefix("ETCD_").lower().replace("_", "-")
            assert flag in flags, f"{block.where}: etcd has no --{flag}"
