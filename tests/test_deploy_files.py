"""The deployment kit in deploy/ agrees with the code, checked without docker or
systemd (neither runs here): the sample bookie.toml names every setting at its default, and
the systemd units, the Dockerfile and the compose file only use commands, flags and paths
that exist, with etcd as three members and three bookies on volumes and addresses of their own.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest

from aiobk.autorecovery import AutoRecoveryConfig
from aiobk.bookie.config import BookieConfig
from aiobk.commands.autorecovery import start_command as autorecovery_start
from aiobk.commands.bookie import start_command as bookie_start
from aiobk.metadata.uri import parse_etcd_uri

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
SAMPLE = DEPLOY / "bookie.toml"
CONFIG_IN_IMAGE = "/etc/aiobk/bookie.toml"
KEY = re.compile(r"^(#\s*)?([a-z_]+) = ")
TABLE = re.compile(r"^\[([a-z_.]+)\]$")

pytestmark = pytest.mark.timeout(30)


# ------------------------------------------------------------------ bookie.toml


def test_the_sample_config_names_every_setting_at_its_default() -> None:
    loaded = BookieConfig.from_toml(str(SAMPLE))  # a deprecated or ignored key warns: fails
    assert loaded == BookieConfig(data_dir=loaded.data_dir)  # every other setting: its default
    tables = {
        "": {f.name: f for f in dataclasses.fields(BookieConfig) if f.name != "autorecovery"},
        "autorecovery": {f.name: f for f in dataclasses.fields(AutoRecoveryConfig)},
    }
    fields = {_name(t, key): f for t, known in tables.items() for key, f in known.items()}
    lines = SAMPLE.read_text().splitlines()
    named: dict[str, bool] = {}  # setting (table.key) -> set (False: shown commented out)
    table = ""  # the [table] the lines belong to
    for number, line in enumerate(lines):
        header = TABLE.match(line)
        if header is not None:
            table = header.group(1)
            assert table in tables, f"bookie.toml:{number + 1}: no table [{table}]"
            continue
        match = KEY.match(line)
        if match is None:
            continue
        key, commented = match.group(2), match.group(1) is not None
        name = _name(table, key)
        assert key in tables[table], f"bookie.toml:{number + 1}: {name} is no setting"
        assert name not in named, f"bookie.toml:{number + 1}: {name} twice"
        named[name] = not commented
        above = lines[number - 1]
        assert above.startswith("#"), f"bookie.toml:{number + 1}: {name} has no comment above"
        assert KEY.match(above) is None, f"bookie.toml:{number + 1}: {name}'s comment is a key"
    assert sorted(named) == sorted(fields)
    # Commented out exactly where there is nothing to write: an unset (None) default.
    unset = {name for name, f in fields.items() if f.default is None}
    assert {name for name, is_set in named.items() if not is_set} == unset
    assert all(named[name] for name in fields if name not in unset)


def _name(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


# ------------------------------------------------------------------ systemd units


def options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in param.opts}


def check_flags(args: list[str], command: click.Command) -> dict[str, str]:
    """Every ``--flag`` in ``args`` is an option of ``command``; returns flag -> value."""
    known = options(command)
    values: dict[str, str] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not arg.startswith("--"):
            continue
        flag, sep, value = arg.partition("=")
        assert flag in known, f"{flag} is not an option of `{command.name}`"
        if not sep and index < len(args) and not args[index].startswith("--"):
            value = args[index]
            index += 1
        values[flag] = value
    return values


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string((DEPLOY / name).read_text())
    assert parser.sections() == ["Unit", "Service", "Install"]
    return parser


@pytest.mark.parametrize(
    ("name", "words", "command"),
    [
        ("aiobk-bookie.service", ["bookie", "start"], bookie_start),
        ("aiobk-autorecovery.service", ["autorecovery", "start"], autorecovery_start),
    ],
)
def test_the_systemd_units_run_an_existing_command(
    name: str, words: list[str], command: click.Command
) -> None:
    service = unit(name)["Service"]
    args = shlex.split(service["ExecStart"])
    assert Path(args[0]).name == "aiobk"
    assert args[1:3] == words
    assert check_flags(args[3:], command)["--config"] == CONFIG_IN_IMAGE
    assert service["KillSignal"] == "SIGTERM"  # the clean stop
    assert service["Restart"] == "on-failure"
    # A pip install holds no documentation files: a unit names none (`systemctl help` would
    # point at a path that does not exist).
    pages = unit(name)["Unit"].get("Documentation", "").split()
    assert not [page for page in pages if page.startswith("file:")]


# ------------------------------------------------------------------ Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of deploy/Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    steps = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            instruction, _sep, rest = line.strip().partition(" ")
            steps.append((instruction.upper(), rest.strip()))
    return steps


def test_the_dockerfile_installs_the_project_and_starts_a_bookie() -> None:
    steps = dockerfile()
    assert steps[0] == ("FROM", "python:3.11-slim")
    copies = [args.split() for instruction, args in steps if instruction == "COPY"]
    for *sources, _target in copies:
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    # Every directory the build maps into the aiobk namespace (aiobk/* symlinks) is copied.
    copied = {source.rstrip("/") for *sources, _t in copies for source in sources}
    layers = {p.name for p in (REPO / "aiobk").iterdir() if p.is_symlink()}
    assert layers <= copied
    assert ["deploy/bookie.toml", CONFIG_IN_IMAGE] in copies
    # The image runs a bookie: the project with the bookie extra.
    assert any(i == "RUN" and "pip install" in a and " '.[bookie]'" in a for i, a in steps)
    entrypoint = json.loads(next(a for i, a in steps if i == "ENTRYPOINT"))
    cmd = json.loads(next(a for i, a in steps if i == "CMD"))
    assert entrypoint == ["aiobk"]
    assert cmd[:2] == ["bookie", "start"]
    assert check_flags(cmd[2:], bookie_start)["--config"] == CONFIG_IN_IMAGE


# ------------------------------------------------------------------ docker-compose.yml


def parse_yaml(text: str) -> Any:
    """The subset of YAML the compose file is written in (PyYAML is not installed here):
    block mappings, block sequences of scalars, plain or quoted scalars, whole-line comments."""
    lines = []
    for raw in text.splitlines():
        content = raw.strip()
        if content and not content.startswith("#"):
            lines.append((len(raw) - len(raw.lstrip(" ")), content))
    value, end = _yaml_block(lines, 0, lines[0][0])
    assert end == len(lines), f"unexpected indentation at {lines[end][1]!r}"
    return value


def _yaml_block(lines: list[tuple[int, str]], index: int, indent: int) -> tuple[Any, int]:
    if lines[index][1].startswith("- "):
        items = []
        while index < len(lines) and lines[index][0] == indent:
            assert lines[index][1].startswith("- "), lines[index][1]
            items.append(_yaml_scalar(lines[index][1][2:]))
            index += 1
        return items, index
    mapping: dict[str, Any] = {}
    while index < len(lines) and lines[index][0] == indent:
        key, sep, rest = lines[index][1].partition(":")
        assert sep, lines[index][1]
        assert key not in mapping, lines[index][1]
        index += 1
        if rest.strip():
            mapping[key] = _yaml_scalar(rest.strip())
        elif index < len(lines) and lines[index][0] > indent:
            mapping[key], index = _yaml_block(lines, index, lines[index][0])
        else:
            mapping[key] = None
    return mapping, index


def _yaml_scalar(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    assert not text.startswith(("[", "{", "&", "*", "|", ">")), f"outside the subset: {text}"
    return text


def flag_values(args: list[str]) -> dict[str, str]:
    return dict(arg.partition("=")[::2] for arg in args if arg.startswith("--"))


def test_the_compose_file_runs_three_etcd_members_and_three_bookies() -> None:
    compose = parse_yaml((DEPLOY / "docker-compose.yml").read_text())
    services: dict[str, Any] = compose["services"]
    etcds = {name: s for name, s in services.items() if name.startswith("etcd")}
    bookies = {name: s for name, s in services.items() if name.startswith("bookie")}
    assert len(etcds) == 3
    assert len(bookies) == 3

    # etcd: one cluster of the three, each member named as the others know it.
    peers, clients = {}, []
    for name, service in etcds.items():
        flags = flag_values(service["command"])
        assert flags["--name"] == name
        peers[name] = flags["--initial-advertise-peer-urls"]
        clients.append(flags["--advertise-client-urls"].removeprefix("http://"))
    for service in etcds.values():
        flags = flag_values(service["command"])
        initial = dict(m.split("=", 1) for m in flags["--initial-cluster"].split(","))
        assert initial == peers
        assert flags["--auto-compaction-mode"] == "revision"  # docs/operations/disks.md

    # bookies: the image's bookie command, every etcd member named, an address and volumes each.
    addresses: set[str] = set()
    mounts: list[str] = []
    for name, service in bookies.items():
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / service["build"]["context"] / "deploy" / "Dockerfile").is_file()
        args = service["command"]
        assert args[:2] == ["bookie", "start"]
        flags = check_flags(args[2:], bookie_start)
        assert flags["--config"] == CONFIG_IN_IMAGE
        endpoints = parse_etcd_uri(flags["--metadata"]).endpoints
        assert sorted(f"{host}:{port}" for host, port in endpoints) == sorted(clients)
        assert flags["--advertised-address"] == f"{name}:{flags['--port']}"
        addresses.add(flags["--advertised-address"])
        volumes = dict(v.split(":", 1)[::-1] for v in service["volumes"])
        assert volumes.keys() == {flags["--data-dir"], flags["--journal-dir"]}
        mounts += volumes.values()
    assert len(addresses) == 3
    etcd_mounts = [v.split(":", 1)[0] for s in etcds.values() for v in s["volumes"]]
    everything = mounts + etcd_mounts
    assert len(set(everything)) == len(everything)  # no volume shared
    assert set(everything) == set(compose["volumes"])
