"""deploy/ run as ``docker build``, ``docker compose up`` and systemd would run it, emulated
without them (no docker engine runs here and no image can be pulled; tests/test_deploy_files.py
checks the same files statically), so that a broken deploy file fails a test.

- The image (deploy/Dockerfile). The build context is the repository's files as a fresh clone
  with the working tree's changes has them (what git lists, symlinks kept), less the patterns of
  deploy/Dockerfile.dockerignore (BuildKit reads ``<Dockerfile>.dockerignore``). Each
  instruction is carried out in order over a fake root directory: WORKDIR and COPY into it (a
  source that is missing, or that the dockerignore leaves out, fails), ``RUN pip install .``
  into a fresh venv that stands for the base image's /usr/local, the RUN's ``cd``, ``rm -rf``
  and ``mkdir -p`` on the fake root, its ``useradd`` and ``chown`` recorded (who owns what);
  USER, VOLUME, EXPOSE, STOPSIGNAL, ENTRYPOINT and CMD recorded. Any other instruction or shell
  command fails: a new line in the Dockerfile comes with its emulation here.
- A container of the image: its own copy of the fake root; each volume a directory of its own,
  a new one starting as a copy of the image's directory there (as docker fills an empty named
  volume), and one for each VOLUME nothing is mounted on (docker's anonymous volumes); absolute
  paths in its command and in the bookie.toml it reads mapped onto those; its own loopback
  address standing for its network interface (``0.0.0.0`` becomes it; servers listen on
  127.0.0.x only) and compose's DNS (``etcd1:2379`` becomes that service's address and a free
  port there, the same one wherever the service's port is named); the image's environment (no
  PYTHONPATH) and working directory (the WORKDIR, outside the repository), so that only the
  aiobk installed in the venv runs.
- ``docker run`` of the image's ENTRYPOINT + CMD against a real etcd: it serves where the CMD
  says, a client writes and reads a ledger through it, ``aiobk simpletest`` runs in the image,
  its STOPSIGNAL stops it with exit 0 within ``docker stop``'s 10 s, and it wrote only into its
  volumes, which the image's USER owns.
- ``docker compose up``: the three etcd services' commands run with the system etcd binary
  (etcd 3.4 here where the compose file names the etcd 3.5 image: the flags it uses are the
  same in both), the three bookies through the image, in depends_on order without waiting for
  readiness (depends_on only orders starts), under their restart policy (a bookie that exits
  because etcd does not answer yet is started again, after docker's doubling delay). Then
  ``run --rm cli`` lists the three bookies by their advertised addresses and runs
  ``simpletest``; then the stop: the image's STOPSIGNAL, exit 0 within stop_grace_period, the
  bookies gone from the registry, then etcd.
- systemd: ``systemd-analyze verify`` of each unit in deploy/ (ExecStart's /opt/aiobk pointing
  at the venv), and each unit's ExecStart run as systemd runs it (the environment systemd gives,
  working directory /) against a real etcd, stopped by its KillSignal: exit 0 within
  TimeoutStopSec.

What is not emulated: the base image (python:3.11-slim: here the running interpreter, in a
venv; the project's dependencies are not installed from PyPI but seen through a .pth), the etcd
3.5 image (etcd 3.4), docker's networking (separate network namespaces: here addresses of one
host's loopback, so a server on its container's own 127.0.0.1 is caught by checking where it
listens, not by being unreachable; ``docker run`` reaches etcd on the host's loopback, which a
real container could not), users and permissions (every process runs as this test's user; the
USER's ownership of what the bookie writes is checked from the Dockerfile's ``chown``), and
systemd itself (User=, EnvironmentFile=, the sandboxing options, Restart=).

One deliberate change: each bookie.toml a bookie reads here gets tests/support/procs.py's
HOST_DISK_SETTINGS (no disk reserve, no read-only at a full disk), as every test bookie does:
the disk of this shared host is filled by other tenants.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess, free_port, open_store
from aiobk.metadata.processes import dying_with_parent
from tests.support.procs import HOST_DISK_SETTINGS
from tests.support.wait import wait_until_sync
from tests.test_deploy_files import dockerfile, parse_yaml, unit

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"  # BuildKit: <Dockerfile>.dockerignore
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
UNITS = sorted(path.name for path in DEPLOY.glob("*.service"))
# /opt/aiobk, the units' venv (their header comment), is this module's venv too.
UNIT_VENV = "/opt/aiobk"

DOCKER_STOP_TIMEOUT = 10.0  # `docker stop` without -t, and compose's default stop_grace_period
READY_TIMEOUT = 60.0  # until a server prints its line, restarts included
COMMAND_TIMEOUT = 60.0  # a one-off command (`run --rm cli ...`, `bookie format`)
MAX_STARTS = 8  # a container's starts under its restart policy, at most (12.7 s of delays)
DOCKER_RUN_ADDRESS = "127.0.0.11"  # compose's services take 127.0.0.2 and up
SERVING = re.compile(r"^bookie (\S+) serving on (\S+):(\d+)$")
# The python image's PATH; /usr/local is the venv here.
IMAGE_PATH = ("/usr/local/bin", "/usr/local/sbin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# What systemd's manager gives a system service (no User= lookup here: HOME is a temp dir).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ETCD_IMAGE = re.compile(r"quay\.io/coreos/etcd:v3\.\d+\.\d+")
COMPOSE_KEYS = {"name", "services", "volumes"}
SERVICE_KEYS = {
    "build",
    "command",
    "depends_on",
    "environment",
    "image",
    "profiles",
    "restart",
    "stop_grace_period",
    "volumes",
}
PORT_FLAG = re.compile(r"--[a-z-]*port")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# ------------------------------------------------------------------ small parsers

_DURATION_UNITS = {
    "us": 1e-6, "ms": 0.001, "msec": 0.001, "": 1.0, "s": 1.0, "sec": 1.0, "second": 1.0,
    "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0,
    "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
}  # fmt: skip


def duration(text: str) -> float:
    """Seconds of a compose duration ("2m", "1m30s") or a systemd time span ("120", "2min")."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    assert parts, f"not a duration: {text!r}"
    assert re.fullmatch(r"(?:\d+(?:\.\d+)?\s*[a-z]*\s*)+", text.strip()), text
    return sum(float(number) * _DURATION_UNITS[unit_] for number, unit_ in parts)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    assert isinstance(value, str), value
    return json.dumps(value)


def set_toml(text: str, values: dict[str, Any]) -> str:
    """``text`` with each key of ``values`` set (its line, or its commented-out example line,
    replaced; appended when the file has neither)."""
    lines = text.splitlines()
    for key, value in values.items():
        line = f"{key} = {toml_value(value)}"
        for index, old in enumerate(lines):
            if re.match(rf"^(#\s*)?{key} = ", old):
                lines[index] = line
                break
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the build context


def _glob_regex(pattern: str) -> str:
    """A dockerignore pattern (Go's filepath.Match, plus ``**``: any number of directories)."""
    out: list[str] = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            out.append(".*")
            index += 2
        elif pattern[index] == "*":
            out.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            out.append("[^/]")
            index += 1
        elif pattern[index] == "[":
            end = pattern.index("]", index)
            body = pattern[index + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            index = end + 1
        elif pattern[index] == "\\":
            out.append(re.escape(pattern[index + 1]))
            index += 2
        else:
            out.append(re.escape(pattern[index]))
            index += 1
    return "".join(out)


def ignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, regex) for each pattern of a .dockerignore, in order (``!`` re-includes)."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        excludes = not line.startswith("!")
        pattern = posixpath.normpath(line.removeprefix("!").strip()).lstrip("/")
        rules.append((excludes, re.compile(_glob_regex(pattern))))
    return rules


def ignored(name: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """As docker decides: the last pattern that matches the path or one of its parent
    directories says whether it is left out."""
    parts = name.split("/")
    prefixes = ["/".join(parts[:count]) for count in range(1, len(parts) + 1)]
    result = False
    for excludes, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            result = excludes
    return result


def build_context(dest: Path) -> list[str]:
    """The files ``docker build`` sends from the repository's root into ``dest``: what git
    tracks or would track (tests/test_packaging.py's ``_copy_checkout``; git-ignored files are
    left out here, which docker would send unless the dockerignore says otherwise), less what
    the dockerignore leaves out; returns the names it left out."""
    rules = ignore_rules(DOCKERIGNORE.read_text())
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True, timeout=30,
    ).stdout.decode()  # fmt: skip
    left_out = []
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, dest / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet committed
        if ignored(name, rules):
            left_out.append(name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return left_out


# ------------------------------------------------------------------ the image


def _under(root: Path, container_path: str) -> Path:
    assert container_path.startswith("/"), f"not an absolute path: {container_path}"
    return root / posixpath.normpath(container_path).lstrip("/")


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


@dataclass
class Image:
    """What the emulated build made: the fake root, the venv standing for /usr/local, and what
    the instructions recorded."""

    root: Path
    usr_local: Path
    workspace: Path
    left_out: list[str]
    base: str = ""
    workdir: str = "/"
    user: str = "root"
    users: dict[str, str] = field(default_factory=lambda: {"root": "/root"})  # name -> home
    groups: set[str] = field(default_factory=lambda: {"root"})
    chowned: list[tuple[str, str, bool]] = field(default_factory=list)  # path, user, -R
    volumes: list[str] = field(default_factory=list)
    exposed: set[int] = field(default_factory=set)
    stop_signal: signal.Signals = signal.SIGTERM  # docker's default
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    def path(self, container_path: str) -> Path:
        normal = posixpath.normpath(container_path)
        if _within(normal, "/usr/local"):
            return self.usr_local / posixpath.relpath(normal, "/usr/local")
        return _under(self.root, normal)

    def owner(self, container_path: str) -> str:
        """Who owns ``container_path`` after the build (the last chown reaching it; COPY and
        mkdir as root). Files made after a ``chown -R`` count as its, an approximation."""
        owner = "root"
        for path, user, recursive in self.chowned:
            if container_path == path or (recursive and _within(container_path, path)):
                owner = user
        return owner

    @property
    def site_packages(self) -> Path:
        return Path(sysconfig.get_path("purelib", vars={"base": str(self.usr_local)}))


def _shell_words(text: str) -> list[list[str]]:
    """The commands of a RUN's shell form, joined by ``&&`` (any other operator fails)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token == "&&":
            commands.append([])
            continue
        assert not set(token) <= set("();<>|&"), f"RUN {text}: `{token}` is not emulated"
        commands[-1].append(token)
    assert all(commands), f"RUN {text}: an empty command"
    return commands


def _options(
    words: list[str], flags: set[str], valued: set[str]
) -> tuple[dict[str, str], list[str]]:
    """(option -> value, operands) of a command's words: ``flags`` take no value, ``valued``
    one; anything else starting with - fails (not emulated)."""
    found: dict[str, str] = {}
    rest: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word in flags:
            found[word] = ""
        elif word in valued:
            found[word] = words[index]
            index += 1
        else:
            assert not word.startswith("-"), f"option {word} is not emulated"
            rest.append(word)
    return found, rest


class ImageBuilder:
    """Carries out deploy/Dockerfile's instructions over ``image``."""

    def __init__(self, image: Image, context: Path) -> None:
        self.image = image
        self.context = context

    def build(self, steps: list[tuple[str, str]]) -> Image:
        assert steps, "an empty Dockerfile"
        assert steps[0][0] == "FROM", "the Dockerfile must start with FROM"
        assert [i for i, _a in steps].count("FROM") == 1, "multi-stage builds are not emulated"
        for instruction, args in steps:
            handler = getattr(self, f"step_{instruction.lower()}", None)
            assert handler is not None, (
                f"Dockerfile: {instruction} is not emulated; teach tests/test_deploy_run.py"
            )
            handler(args)
        return self.image

    # ---- instructions

    def step_from(self, args: str) -> None:
        match = re.fullmatch(r"python:(\d+)\.(\d+)(?:\.\d+)?-slim(?:-[a-z]+)?", args)
        assert match, f"FROM {args}: only the python:X.Y-slim images are emulated"
        requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        least = re.fullmatch(r">=(\d+)\.(\d+)", requires["requires-python"])
        assert least, requires["requires-python"]
        version = (int(match.group(1)), int(match.group(2)))
        assert version >= (int(least.group(1)), int(least.group(2))), (
            f"FROM {args}: its Python is older than requires-python"
        )
        self.image.base = args
        # The base image's Python: the running interpreter, in a venv standing for /usr/local.
        # Made without pip: the venv's own bundled setuptools would shadow the one the build
        # needs (pyproject's setuptools>=77). The network may not serve PyPI here, so the
        # project's dependencies, pip and the build backend are made visible to the venv by a
        # .pth naming the running interpreter's site-packages (sysconfig's purelib and platlib
        # of sys.executable); `pip install` then installs only the project into the venv.
        venv = self.image.usr_local
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        host_sites = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
        self.image.site_packages.mkdir(parents=True, exist_ok=True)
        (self.image.site_packages / "_aiobk_test_host_site.pth").write_text(
            "".join(f"{site}\n" for site in host_sites)
        )

    def step_workdir(self, args: str) -> None:
        self.image.workdir = posixpath.normpath(posixpath.join(self.image.workdir, args))
        self.image.path(self.image.workdir).mkdir(parents=True, exist_ok=True)

    def step_copy(self, args: str) -> None:
        words = json.loads(args) if args.startswith("[") else args.split()
        assert not any(word.startswith("--") for word in words), f"COPY {args}: flags"
        *sources, target = words
        assert sources, f"COPY {args}: no source"
        dest = posixpath.join(self.image.workdir, target)
        rules = ignore_rules(DOCKERIGNORE.read_text())
        for source in sources:
            assert not set(source) & set("*?["), f"COPY {source}: wildcards are not emulated"
            name = posixpath.normpath(source)
            assert not name.startswith(".."), f"COPY {source}: outside the build context"
            src = self.context / name
            if not src.exists():
                if ignored(name, rules) or any(_within(n, name) for n in self.image.left_out):
                    why = f"left out of the build context by {DOCKERIGNORE.name}"
                elif (REPO / name).exists():
                    why = "not in the build context (git ignores it)"
                else:
                    why = "not in the repository"
                pytest.fail(f"Dockerfile: COPY {source}: {why}")
            if src.is_dir():  # its contents, symlinks as symlinks
                shutil.copytree(src, self.image.path(dest), symlinks=True, dirs_exist_ok=True)
                continue
            into = target.endswith("/") or len(sources) > 1 or self.image.path(dest).is_dir()
            path = self.image.path(posixpath.join(dest, posixpath.basename(name)) if into else dest)
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, path)

    def step_run(self, args: str) -> None:
        cwd = self.image.workdir
        for name, *words in _shell_words(args):
            command = getattr(self, f"sh_{name}", None)
            assert command is not None, f"RUN: `{name}` is not emulated"
            cwd = command(words, cwd)

    def step_user(self, args: str) -> None:
        user = args.partition(":")[0]
        assert user in self.image.users, f"USER {args}: no such user (useradd it first)"
        self.image.user = user

    def step_volume(self, args: str) -> None:
        paths = json.loads(args) if args.startswith("[") else args.split()
        for path in paths:
            assert path.startswith("/"), f"VOLUME {path}: not absolute"
            self.image.volumes.append(posixpath.normpath(path))
            self.image.path(path).mkdir(parents=True, exist_ok=True)

    def step_expose(self, args: str) -> None:
        for port in args.split():
            number, _sep, protocol = port.partition("/")
            assert protocol in ("", "tcp"), f"EXPOSE {port}: only tcp"
            self.image.exposed.add(int(number))

    def step_stopsignal(self, args: str) -> None:
        self.image.stop_signal = (
            signal.Signals(int(args)) if args.isdigit() else signal.Signals[args.upper()]
        )

    def _exec_form(self, instruction: str, args: str) -> list[str]:
        # The shell form runs /bin/sh -c: the stop signal would reach the shell, not aiobk.
        assert args.startswith("["), f"{instruction} {args}: only the exec form (JSON) is emulated"
        words = json.loads(args)
        assert isinstance(words, list)
        assert all(isinstance(word, str) for word in words)
        return words

    def step_entrypoint(self, args: str) -> None:
        self.image.entrypoint = self._exec_form("ENTRYPOINT", args)

    def step_cmd(self, args: str) -> None:
        self.image.cmd = self._exec_form("CMD", args)

    # ---- shell commands of RUN

    def _path(self, cwd: str, path: str) -> str:
        return posixpath.normpath(posixpath.join(cwd, path))

    def sh_pip(self, words: list[str], cwd: str) -> str:
        _flags, operands = _options(words, {"--no-cache-dir"}, set())
        assert operands[:1] == ["install"], f"pip {' '.join(words)}: only pip install"
        assert len(operands) == 2, f"pip {' '.join(words)}: one project to install"
        project, _bracket, extras = operands[1].partition("[")
        where = self._path(cwd, project)
        pyproject = self.image.path(where) / "pyproject.toml"
        assert pyproject.is_file(), f"pip install: {where}"
        known = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
        for extra in filter(None, extras.rstrip("]").split(",")):
            assert extra in known, f"pip install {operands[1]}: no extra {extra!r}"
        python = self.image.usr_local / "bin" / "python"
        env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(self.image.workspace)}
        done = subprocess.run(
            [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
             "--no-cache-dir", "--no-index", "--disable-pip-version-check", operands[1]],
            check=False, cwd=self.image.path(cwd), env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"RUN pip install failed:\n{done.stdout}\n{done.stderr}"
        return cwd

    def sh_cd(self, words: list[str], cwd: str) -> str:
        (path,) = words
        cwd = self._path(cwd, path)
        assert self.image.path(cwd).is_dir(), f"cd {path}: no such directory"
        return cwd

    def sh_rm(self, words: list[str], cwd: str) -> str:
        options, paths = _options(words, {"-r", "-f", "-rf", "-fr"}, set())
        recursive = any("r" in option for option in options)
        force = any("f" in option for option in options)
        for operand in paths:
            path = self._path(cwd, operand)
            assert path != "/", "rm of /"
            target = self.image.path(path)
            if target.is_dir() and not target.is_symlink():
                assert recursive, f"rm {operand}: a directory"
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            else:
                assert force, f"rm {operand}: no such file"
        return cwd

    def sh_useradd(self, words: list[str], cwd: str) -> str:
        options, operands = _options(
            words,
            {"--system", "-r", "--user-group", "-U", "--no-create-home", "-M",
             "--create-home", "-m"},
            {"--uid", "-u", "--home-dir", "-d", "--shell", "-s"},
        )  # fmt: skip
        (user,) = operands
        home = options.get("--home-dir", options.get("-d", f"/home/{user}"))
        self.image.users[user] = home
        if {"--user-group", "-U"} & options.keys():
            self.image.groups.add(user)
        if {"--create-home", "-m"} & options.keys():
            self.image.path(home).mkdir(parents=True, exist_ok=True)
            self.image.chowned.append((home, user, False))
        return cwd

    def sh_mkdir(self, words: list[str], cwd: str) -> str:
        options, paths = _options(words, {"-p"}, set())
        for operand in paths:
            target = self.image.path(self._path(cwd, operand))
            if "-p" in options:
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.mkdir()
        return cwd

    def sh_chown(self, words: list[str], cwd: str) -> str:
        options, operands = _options(words, {"-R"}, set())
        owner, *paths = operands
        user, _sep, group = owner.partition(":")
        assert user in self.image.users, f"chown {owner}: no user {user}"
        assert not group or group in self.image.groups, f"chown {owner}: no group {group}"
        for operand in paths:
            path = self._path(cwd, operand)
            assert self.image.path(path).exists(), f"chown {operand}: no such file"
            self.image.chowned.append((path, user, "-R" in options))
        return cwd


def clean_env(**extra: str) -> dict[str, str]:
    """An environment with nothing of this test run's Python in it (no PYTHONPATH, no
    VIRTUAL_ENV): what runs in it finds only what its own interpreter has."""
    return {"LANG": "C.UTF-8", **extra}


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """`docker build -f deploy/Dockerfile .`, emulated once for the module."""
    workspace = tmp_path_factory.mktemp("image")
    context = workspace / "context"
    left_out = build_context(context)
    assert "tests/conftest.py" in left_out  # the dockerignore was read
    root = workspace / "root"
    root.mkdir()
    image = Image(root, workspace / "usr-local", workspace, left_out)
    ImageBuilder(image, context).build(dockerfile())

    # The aiobk that runs is the venv's, installed as real files (aiobk/'s symlinks followed).
    python = image.path("/usr/local/bin/python")
    probe = (
        "import aiobk, aiobk.bookie.server as server, aiobk.client, aiobk.cli; "
        "print(aiobk.__file__); print(server.__file__)"
    )
    done = subprocess.run(
        [python, "-c", probe], check=False, cwd=workspace, env=clean_env(PATH="/usr/bin:/bin"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for module_file in done.stdout.split():
        assert Path(module_file).is_relative_to(image.site_packages), module_file
        assert not Path(module_file).parent.is_symlink(), module_file
    leftovers = [p.name for p in image.root.rglob("*") if p.name in ("__pycache__", "build")]
    assert not leftovers, f"the image holds {leftovers}"
    return image


# ------------------------------------------------------------------ containers


@dataclass
class Network:
    """A docker network: each container its own loopback address (its interface, and the
    address its service name resolves to), each of its ports a free one there."""

    addresses: dict[str, str]
    ports: dict[tuple[str, int], int] = field(default_factory=dict)

    def port(self, service: str, port: int) -> int:
        if (service, port) not in self.ports:
            self.ports[service, port] = free_port(self.addresses[service])
        return self.ports[service, port]

    def container_ports(self, service: str, host_port: int) -> set[int]:
        found = self.ports.items()
        return {inner for (name, inner), outer in found if (name, outer) == (service, host_port)}

    def resolve(self, text: str, own: str) -> str:
        """``text`` with ``0.0.0.0:PORT`` and ``SERVICE:PORT`` as this host reaches them."""
        names = "|".join(re.escape(name) for name in sorted(self.addresses, key=len)[::-1])
        hosts = rf"0\.0\.0\.0|{names}"

        def replace(match: re.Match[str]) -> str:
            service = own if match.group(1) == "0.0.0.0" else match.group(1)
            return f"{self.addresses[service]}:{self.port(service, int(match.group(2)))}"

        text = re.sub(rf"(?<![\w.-])({hosts}):(\d+)(?!\d)", replace, text)
        if text == "0.0.0.0":
            return self.addresses[own]
        left = re.search(rf"(?<![\w.-])({hosts})(?=[:/])", text)
        assert left is None, f"{text}: a host the emulation does not resolve"
        return text


@dataclass
class Proc:
    """One process of a container (or a unit), its output in files; ``start()`` again is a
    restart (its policy: compose's ``restart``)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    logs: Path
    restart: str = "no"
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.logs / f"{self.name}.{self.starts}.out"

    @property
    def err(self) -> Path:
        return self.logs / f"{self.name}.{self.starts}.err"

    def start(self) -> Proc:
        self.starts += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(
                dying_with_parent(self.argv),  # never outlives this test run
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=self.env, cwd=self.cwd,
                start_new_session=True,
            )  # fmt: skip
        return self

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def tail(self) -> str:
        err = self.err.read_text(errors="replace")
        return f"$ {shlex.join(self.argv)}\n{self.output()[-2000:]}\n{err[-4000:]}"

    def _restarts_on(self, code: int) -> bool:
        policy = self.restart.split(":")[0]
        return policy in ("always", "unless-stopped") or (policy == "on-failure" and code != 0)

    def wait_for(self, marker: str, timeout: float = READY_TIMEOUT) -> str:
        """The first line of the current run's stdout holding ``marker``; an exit before it
        restarts the process as its restart policy says (docker's delay: 100 ms, doubling)."""
        assert self.process is not None
        found: list[str] = []
        delay = 0.1

        def printed() -> bool:
            nonlocal delay
            found.extend(line for line in self.output().splitlines() if marker in line)
            if found:
                return True
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                if not self._restarts_on(code) or self.starts >= MAX_STARTS:
                    pytest.fail(f"{self.name} exited with {code} before {marker!r}:\n{self.tail()}")
                self.exits.append(code)
                time.sleep(delay)  # the restart policy's backoff: a pause it takes on purpose
                delay *= 2
                self.start()
            return False

        wait_until_sync(
            printed, timeout=timeout, what=lambda: f"{self.name}: {marker!r}\n{self.tail()}"
        )
        return found[0]

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} still running after {timeout:g}s:\n{self.tail()}")

    def stop(self, signum: signal.Signals, grace: float) -> tuple[int, float]:
        """(exit code, seconds): ``signum``, then SIGKILL and a failure after ``grace``."""
        assert self.process is not None
        started = time.monotonic()
        code = self.process.poll()
        assert code is None, f"{self.name} had exited ({code}) before its stop:\n{self.tail()}"
        self.process.send_signal(signum)
        return self.wait(grace), time.monotonic() - started

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@dataclass
class Container:
    """A container: its own copy of the image's root (or an empty one for an image emulated by a
    host binary, ``binaries``), volumes mounted on it, an address on the network."""

    name: str
    network: Network
    base: Path
    image: Image | None
    mounts: dict[str, Path] = field(default_factory=dict)  # container path -> volume
    binaries: dict[str, str] = field(default_factory=dict)  # container path -> host binary
    configured: bool = False

    @classmethod
    def create(
        cls,
        name: str,
        network: Network,
        workspace: Path,
        image: Image | None,
        volumes: dict[str, Path],
        binaries: dict[str, str] | None = None,
    ) -> Container:
        base = workspace / "containers" / name
        if image is not None:
            shutil.copytree(image.root, base / "root", symlinks=True)
        else:
            (base / "root").mkdir(parents=True)
        container = cls(name, network, base, image, dict(volumes), binaries or {})
        for declared in image.volumes if image is not None else []:
            if declared not in container.mounts:  # an anonymous volume
                container.mounts[declared] = base / "anonymous" / declared.strip("/")
        for path, volume in container.mounts.items():
            if volume.exists():
                continue
            # A new volume starts as a copy of what the image has there (docker's copy-up).
            source = image.path(path) if image is not None else None
            if source is not None and source.is_dir():
                shutil.copytree(source, volume, symlinks=True)
            else:
                volume.mkdir(parents=True)
        return container

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def address(self) -> str:
        return self.network.addresses[self.name]

    def path(self, container_path: str) -> Path:
        normal = posixpath.normpath(container_path)
        for mount in sorted(self.mounts, key=len, reverse=True):
            if _within(normal, mount):
                return self.mounts[mount] / posixpath.relpath(normal, mount)
        if self.image is not None and _within(normal, "/usr/local"):
            return self.image.path(normal)
        return _under(self.root, normal)

    def executable(self, name: str) -> str:
        """What exec of ``name`` in this container runs (PATH: the python image's)."""
        candidates = [name] if "/" in name else [f"{d}/{name}" for d in IMAGE_PATH]
        for candidate in candidates:
            if candidate in self.binaries:
                return self.binaries[candidate]
            path = self.path(candidate)
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
        pytest.fail(f"{self.name}: no executable {name} in the container")

    def value(self, flag: str, value: str) -> str:
        """A flag's (or a setting's) value as seen from the host."""
        if PORT_FLAG.fullmatch(flag) and value.isdigit():
            return str(self.network.port(self.name, int(value)))
        if value.startswith("/") and flag != "--rack":  # a rack is /ZONE/RACK, not a path
            return str(self.path(value))
        return self.network.resolve(value, self.name)

    def args(self, args: list[str]) -> list[str]:
        out = []
        for index, arg in enumerate(args):
            if arg.startswith("--") and "=" in arg:
                flag, _sep, value = arg.partition("=")
                out.append(f"{flag}={self.value(flag, value)}")
            elif arg.startswith("-"):
                out.append(arg)
            else:
                before = args[index - 1] if index else ""
                flag = before if before.startswith("--") and "=" not in before else ""
                out.append(self.value(flag, arg))
        assert not any("0.0.0.0" in arg for arg in out), out  # servers on loopback only
        return out

    def configure(self, config: Path) -> None:
        """The bookie.toml the container reads, as seen from the host (its paths, addresses
        and ports), with the test host's disk settings."""
        lines = config.read_text().splitlines()
        for index, line in enumerate(lines):
            match = re.fullmatch(r"([a-z_]+) = (.+)", line)
            if match is None:
                continue
            key, raw = match.groups()
            value = tomllib.loads(f"v = {raw}")["v"]
            flag = "--" + key.replace("_", "-")
            if isinstance(value, str):
                value = self.value(flag, value)
            elif isinstance(value, int) and PORT_FLAG.fullmatch(flag):
                value = int(self.value(flag, str(value)))
            lines[index] = f"{key} = {toml_value(value)}"
        config.write_text(set_toml("\n".join(lines), HOST_DISK_SETTINGS))

    def run(self, args: list[str], environment: dict[str, str], restart: str = "no") -> Proc:
        """``args`` (the image's ENTRYPOINT + CMD or command) run in the container."""
        if not self.configured:  # once per container: a restart reads the same files
            self.configured = True
            for index, arg in enumerate(args):
                if arg == "--config" or arg.startswith("--config="):
                    path = arg.partition("=")[2] or args[index + 1]
                    assert self.path(path).is_file(), f"{self.name}: no {path} in the container"
                    self.configure(self.path(path))
        image = self.image
        home = image.users[image.user] if image is not None else "/root"
        env = clean_env(
            PATH=f"{self.path('/usr/local/bin')}:/usr/sbin:/usr/bin:/sbin:/bin",
            HOME=str(self.path(home)),
            HOSTNAME=self.name,
        )
        env.update({key: self.value("", value) for key, value in environment.items()})
        cwd = self.path(image.workdir) if image is not None else self.root
        argv = [self.executable(args[0]), *self.args(args[1:])]
        return Proc(self.name, argv, env, cwd, self.base / "logs", restart).start()

    def run_once(self, args: list[str], environment: dict[str, str]) -> tuple[str, str]:
        """``docker run --rm``: (stdout, stderr) of a command that must exit 0."""
        proc = self.run(args, environment)
        try:
            code = proc.wait(COMMAND_TIMEOUT)
        finally:
            proc.kill()
        assert code == 0, f"{shlex.join(args)} exited with {code}:\n{proc.tail()}"
        return proc.output(), proc.err.read_text(errors="replace")


def files_under(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def serving(line: str) -> tuple[str, str, int]:
    """(bookie id, host, port) of a bookie's ``serving on`` line."""
    match = SERVING.match(line.strip())
    assert match is not None, line
    return match.group(1), match.group(2), int(match.group(3))


async def registered(uri: str) -> dict[str, str]:
    async with open_store(uri) as store:
        return {b.bookie_id: b.address for b in await store.list_bookies()}


# ------------------------------------------------------------------ docker run


@pytest.mark.timeout(150)
async def test_docker_run_of_the_image_serves_and_stops_on_its_stop_signal(
    image: Image, etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """``docker run -p 127.0.0.1:PORT:3181 -e AIOBK_METADATA=etcd://... aiobk:dev``: the
    default command serves where it says, a ledger goes through it, and it stops cleanly."""
    assert image.entrypoint
    assert image.cmd
    assert image.user != "root", "the bookie should run as an unprivileged user"
    uri = etcd_server.uri(f"deploy-run-{secrets.token_hex(4)}")
    # The container's interface: a loopback address of its own (not 127.0.0.1, so that a
    # bookie listening on its container's own loopback shows: `docker run -p` reaches the
    # container's interface only).
    network = Network({"bookie": DOCKER_RUN_ADDRESS, "client": DOCKER_RUN_ADDRESS})
    container = Container.create("bookie", network, tmp_path, image, volumes={})
    before = files_under(container.root)
    proc = container.run(image.entrypoint + image.cmd, {"AIOBK_METADATA": uri})
    try:
        bookie_id, host, port = serving(proc.wait_for("serving on"))
        assert host == container.address, f"listens on {host}, not its container's interface"
        assert network.container_ports("bookie", port) <= image.exposed, "a port not EXPOSEd"
        assert await registered(uri) == {bookie_id: f"{host}:{port}"}

        async with BookKeeper(uri) as bk:
            ledger = await bk.create_ledger(1, 1, 1)
            payloads = [f"entry {i} ".encode() * 10 for i in range(25)]
            for data in payloads:
                await ledger.append(data)
            await ledger.close()
            reader = await bk.open_ledger(ledger.ledger_id)
            assert [e.data for e in await reader.read(0, len(payloads) - 1)] == payloads
            await reader.close()

        # `docker run --rm -e AIOBK_METADATA=... aiobk:dev simpletest ...`: the image's client.
        client = Container.create("client", network, tmp_path, image, volumes={})
        out, _err = client.run_once(
            [*image.entrypoint, "simpletest", "--ensemble=1", "--write-quorum=1",
             "--ack-quorum=1", "--entries=200"],
            {"AIOBK_METADATA": uri},
        )  # fmt: skip
        assert "all verified" in out, out

        code, took = proc.stop(image.stop_signal, DOCKER_STOP_TIMEOUT)
        assert code == 0, proc.tail()
        print(f"docker run: stopped by {image.stop_signal.name} in {took:.1f}s")
    finally:
        proc.kill()
    assert await registered(uri) == {}  # it deregistered on the way out

    # It wrote into its volumes only (anything else would be lost with the container), and
    # those are the USER's in the image, so the unprivileged bookie can write them.
    outside = files_under(container.root) - before
    assert not outside, f"the bookie wrote outside its volumes: {sorted(outside)}"
    written = {path: volume for path, volume in container.mounts.items() if any(volume.iterdir())}
    assert written, "the bookie wrote into none of its volumes"
    for path in written:
        assert image.owner(path) == image.user, f"{path} is not the {image.user} user's"
    assert any(volume.rglob("COOKIE") for volume in written.values())
    assert any(volume.rglob("*.txn") for volume in written.values()), "no journal in a volume"


# ------------------------------------------------------------------ docker compose


def _start_order(services: dict[str, Any]) -> list[str]:
    """Dependencies first, as compose starts them (the file's order otherwise)."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name in services, f"depends_on: no service {name}"
        assert name not in path, f"depends_on cycle: {path}"
        if name in order:
            return
        depends = services[name].get("depends_on") or []
        assert isinstance(depends, list), f"{name}: only the list form of depends_on"
        for dependency in depends:
            visit(dependency, (*path, name))
        order.append(name)

    for name in services:
        visit(name, ())
    return order


def _environment(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {key: str(value) for key, value in environment.items()}


def _etcd_members(client_url: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(f"{client_url}/v3/cluster/member/list", data=b"{}")
    with _NO_PROXY.open(request, timeout=5) as response:
        members: list[dict[str, Any]] = json.loads(response.read())["members"]
    return members


@pytest.mark.timeout(360)
async def test_docker_compose_up_runs_a_cluster_that_the_cli_reaches(
    image: Image, tmp_path: Path
) -> None:
    compose = parse_yaml(COMPOSE_FILE.read_text())
    assert set(compose) <= COMPOSE_KEYS, f"not emulated: {set(compose) - COMPOSE_KEYS}"
    services: dict[str, dict[str, Any]] = compose["services"]
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, f"{name}: not emulated: {set(service) - SERVICE_KEYS}"

    # What `up --build` builds is the Dockerfile emulated here, under the tag the others run.
    built: set[str] = set()
    for name, service in services.items():
        if "build" in service:
            build = service["build"]
            assert (COMPOSE_FILE.parent / build["context"]).resolve() == REPO, name
            assert build["dockerfile"] == "deploy/Dockerfile", name
            built.add(service["image"])
    etcd_binary = shutil.which("etcd")
    assert etcd_binary is not None, "etcd is not on PATH; `make setup` installs etcd-server"
    etcds = [name for name, s in services.items() if ETCD_IMAGE.fullmatch(s["image"])]
    for name, service in services.items():
        assert name in etcds or service["image"] in built, f"{name}: {service['image']}"

    network = Network({name: f"127.0.0.{2 + index}" for index, name in enumerate(services)})
    declared = compose.get("volumes") or {}
    volume_dirs = {name: tmp_path / "volumes" / name for name in declared}

    def container(name: str) -> Container:
        mounts = {}
        for entry in services[name].get("volumes") or []:
            source, target, *_mode = entry.split(":")
            assert source in declared, f"{name}: {source} is no named volume (binds: not emulated)"
            mounts[target] = volume_dirs[source]
        if name in etcds:  # the etcd image: the system etcd at the image's path
            return Container.create(
                name, network, tmp_path, None, mounts, {"/usr/local/bin/etcd": etcd_binary}
            )
        return Container.create(name, network, tmp_path, image, mounts)

    def command(name: str) -> list[str]:
        args = list(services[name]["command"])
        return args if name in etcds else [*image.entrypoint, *args]

    up = [name for name in _start_order(services) if not services[name].get("profiles")]
    bookies = [name for name in up if name not in etcds]
    assert len(etcds) == 3
    assert len(bookies) == 3
    procs: dict[str, Proc] = {}
    containers = {name: container(name) for name in up}
    before = {name: files_under(containers[name].root) for name in bookies}
    try:
        # `up`: each container started once its dependencies are (not once they answer).
        started = time.monotonic()
        for name in up:
            restart = str(services[name].get("restart", "no"))
            procs[name] = containers[name].run(command(name), _environment(services[name]), restart)
        lines = {name: procs[name].wait_for("serving on") for name in bookies}
        print(f"compose up: bookies serving after {time.monotonic() - started:.1f}s, "
              f"restarts {({n: procs[n].exits for n in up})}")  # fmt: skip

        # etcd: the three members formed one cluster, each reachable where it advertises.
        for name in etcds:
            process = procs[name].process
            assert process is not None
            assert process.poll() is None, procs[name].tail()
        first = f"http://{network.addresses[etcds[0]]}:{network.port(etcds[0], 2379)}"
        members = {m["name"]: m["clientURLs"] for m in _etcd_members(first)}
        assert members == {
            name: [f"http://{network.addresses[name]}:{network.port(name, 2379)}"] for name in etcds
        }

        # Each bookie listens on its container's interface and registers its advertised name.
        expected = {}
        for name in bookies:
            bookie_id, host, _port = serving(lines[name])
            assert host == network.addresses[name], f"{name} listens on {host}, not its interface"
            flags = dict(arg.partition("=")[::2] for arg in command(name) if "=" in arg)
            advertised = network.resolve(flags["--advertised-address"], name)
            assert bookie_id == advertised
            expected[bookie_id] = advertised
            if "--metrics-port" in flags:
                metrics = network.port(name, int(flags["--metrics-port"]))
                with _NO_PROXY.open(f"http://{host}:{metrics}/metrics", timeout=5) as response:
                    assert b"aiobk_bookie_writable" in response.read()
        metadata = network.resolve(flags["--metadata"], bookies[-1])
        assert await registered(metadata) == expected

        # `docker compose run --rm cli` (bookies list), then `... run --rm cli simpletest`.
        cli = [name for name in services if name not in up]
        assert cli == ["cli"], cli
        environment = _environment(services["cli"])
        out, _err = container("cli").run_once(command("cli"), environment)
        for bookie_id, address in expected.items():
            assert any(
                bookie_id in line and address in line and "writable" in line
                for line in out.splitlines()
            ), f"`bookies list` does not show {bookie_id} at {address}:\n{out}"
        network.addresses["cli-simpletest"] = network.addresses["cli"]
        out, _err = Container.create(
            "cli-simpletest", network, tmp_path, image, volumes={}
        ).run_once([*image.entrypoint, "simpletest"], environment)
        assert "all verified" in out, out

        # `docker compose down`: the bookies (their image's STOPSIGNAL, all at once), then etcd.
        for name in bookies:
            grace = duration(str(services[name].get("stop_grace_period", "10s")))
            code, took = procs[name].stop(image.stop_signal, grace)
            assert code == 0, procs[name].tail()
            print(f"compose down: {name} stopped in {took:.1f}s (grace {grace:g}s)")
        assert await registered(metadata) == {}
        for name in etcds:
            grace = duration(str(services[name].get("stop_grace_period", "10s")))
            procs[name].stop(signal.SIGTERM, grace)
    finally:
        for proc in procs.values():
            proc.kill()
    for name in bookies:  # each bookie wrote into its own named volumes, and only there
        outside = files_under(containers[name].root) - before[name]
        assert not outside, f"{name} wrote outside its volumes: {sorted(outside)}"
        for target, volume in containers[name].mounts.items():
            assert volume.parent == tmp_path / "volumes", f"{name}: {target} on no named volume"
            assert any(volume.iterdir()), f"{name}: nothing written to {target}"


# ------------------------------------------------------------------ systemd


def unit_copy(image: Image, name: str, dest: Path) -> Path:
    """The unit with ExecStart's /opt/aiobk (the venv its header asks for) the test's venv."""
    text = (DEPLOY / name).read_text()
    exec_lines = re.findall(r"^ExecStart=.*$", text, flags=re.MULTILINE)
    assert len(exec_lines) == 1, name
    assert exec_lines[0].startswith(f"ExecStart={UNIT_VENV}/bin/aiobk "), exec_lines[0]
    rewritten = text.replace(
        exec_lines[0], exec_lines[0].replace(UNIT_VENV, str(image.usr_local), 1)
    )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / name).write_text(rewritten)
    return dest / name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verifies_the_unit(image: Image, tmp_path: Path, name: str) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze is not on PATH; `make setup` installs systemd"
    path = unit_copy(image, name, tmp_path / "units")
    done = subprocess.run(
        [analyze, "verify", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    complaints = [line for line in output.splitlines() if name in line]
    assert not complaints, "\n".join(complaints)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("name", "ready"),
    [("aiobk-bookie.service", "serving on"), ("aiobk-autorecovery.service", "running on")],
)
async def test_the_unit_runs_as_systemd_would_and_stops_on_its_kill_signal(
    image: Image, etcd_server: EtcdProcess, tmp_path: Path, name: str, ready: str
) -> None:
    assert name in UNITS
    service = unit(name)["Service"]
    assert service.get("Type", "simple") == "simple"  # running once started: no notify
    for env_file in service.get("EnvironmentFile", "").split():
        # Without "-", a missing file (none here, and none by default) stops the start.
        assert env_file.startswith("-"), f"EnvironmentFile={env_file}: not optional"
    assert "WorkingDirectory" not in service  # then /
    kill_signal = signal.Signals[service.get("KillSignal", "SIGTERM")]
    timeout_stop = duration(service.get("TimeoutStopSec", "90s"))

    # The host's /etc/aiobk/bookie.toml: deploy/bookie.toml with what its header says to set.
    prefix = f"deploy-unit-{secrets.token_hex(4)}"
    uri = etcd_server.uri(prefix)
    port = free_port()
    data, journal = tmp_path / "data", tmp_path / "journal"
    sample = (DEPLOY / "bookie.toml").read_text()
    assert tomllib.loads(sample)["host"] == "127.0.0.1"
    config = tmp_path / "etc" / "bookie.toml"
    config.parent.mkdir()
    settings = {"data_dir": str(data), "journal_dir": str(journal), "metadata_uri": uri}
    config.write_text(set_toml(sample, {**settings, "port": port, **HOST_DISK_SETTINGS}))

    venv_bin = image.usr_local / "bin"
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": SYSTEMD_PATH, "HOME": str(home), "USER": "aiobk", "LOGNAME": "aiobk"}
    # The README's step before the first start: the directories, made by `bookie format`.
    format_ = subprocess.run(
        [venv_bin / "aiobk", "bookie", "format", "--data-dir", data, "--journal-dir", journal],
        check=False, env=env, cwd="/", capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
    )  # fmt: skip
    assert format_.returncode == 0, format_.stderr

    argv = shlex.split(service["ExecStart"])
    assert argv[0][0] not in "-@:+!", "ExecStart prefixes are not emulated"

    def host_path(path: str) -> str:
        if _within(path, UNIT_VENV):
            return str(image.usr_local / posixpath.relpath(path, UNIT_VENV))
        assert path == "/etc/aiobk/bookie.toml", f"ExecStart: {path} is not emulated"
        return str(config)

    argv = [host_path(arg) if arg.startswith("/") else arg for arg in argv]
    assert argv[0] == str(venv_bin / "aiobk")
    proc = Proc(name, argv, env, Path("/"), tmp_path / "journal-output").start()
    try:
        line = proc.wait_for(ready)
        if name == "aiobk-bookie.service":
            assert serving(line)[1:] == ("127.0.0.1", port)
            assert await registered(uri) == {f"127.0.0.1:{port}": f"127.0.0.1:{port}"}
        code, took = proc.stop(kill_signal, timeout_stop)
        assert code == 0, proc.tail()
        print(f"{name}: stopped by {kill_signal.name} in {took:.1f}s")
    finally:
        proc.kill()
    assert await registered(uri) == {}
