"""How aiobk installs: the project's metadata applies without a setuptools warning, the wheel
holds one top-level name, and ``pip install aiobk`` alone is a working client (its commands,
appends and reads against a real cluster) that pulls only a short list of distributions, while
the server commands ask for their extra in one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tomllib
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from aiobk.commands.extras import EXTRAS
from aiobk.metadata import EtcdProcess
from tests.support.cluster import start_cluster
from tests.support.names import unique_name

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_applies_without_a_setuptools_warning(monkeypatch) -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # package discovery and the readme are relative to the project
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # setuptools reports deprecations as warnings
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"


LAYERS = ("protocol", "metadata", "tiered", "bookie", "client", "autorecovery", "pipeline", "bench")


def _copy_checkout(dest: Path) -> None:
    """The files git tracks or would track (symlinks kept), as a fresh clone of them has."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = ROOT / name, dest / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet committed
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the checkout, built with this venv's setuptools."""
    source = tmp_path / "src"
    _copy_checkout(source)
    for layer in LAYERS:
        assert (source / "aiobk" / layer).is_symlink()  # the layout the build must map
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("aiobk-*.whl")
    return wheel


@pytest.mark.timeout(300)
def test_the_wheel_installs_one_top_level_name_aiobk(tmp_path: Path) -> None:
    """A pip install puts exactly one top-level name, ``aiobk``, into site-packages, holding
    every layer as real files (the build follows aiobk/'s symlinks)."""
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["aiobk"]
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"aiobk"}
    for layer in LAYERS:  # every module of every layer, under aiobk/
        expected = {
            f"aiobk/{path.relative_to(ROOT).as_posix()}" for path in (ROOT / layer).rglob("*.py")
        }
        assert expected <= set(names), sorted(expected - set(names))[:5]
    # The compiled record encoders and their types (setup.py builds them where C compiles).
    assert [n for n in names if n.startswith("aiobk/bookie/_records.") and n.endswith(".so")]
    assert "aiobk/bookie/_records.pyi" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()
    )  # fmt: skip
    before = {p.name for p in site.iterdir()}
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    ours = {p.name for p in site.iterdir()} - before
    assert {n for n in ours if not n.endswith(".dist-info")} == {"aiobk"}, sorted(ours)
    server = site / "aiobk" / "bookie" / "server.py"
    assert server.is_file()
    assert not server.is_symlink()
    assert not (site / "aiobk" / "bookie").is_symlink()
    # Run from elsewhere than the checkout: only aiobk imports, none of the bare layer names.
    probe = (
        "import importlib.util, aiobk; "
        f"print([n for n in {LAYERS!r} if importlib.util.find_spec(n)]); print(aiobk.__file__)"
    )
    out = subprocess.run(
        [python, "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True,
        timeout=60,
    ).stdout.splitlines()  # fmt: skip
    assert out[0] == "[]"
    assert out[1].startswith(str(site))


# What `pip install aiobk` may bring: the client's own dependencies (msgpack, crc32c, aetcd with
# grpcio and protobuf, click, obstore) and theirs. A fresh venv also holds pip (and setuptools
# before Python 3.12), which are not counted.
CLIENT_DISTRIBUTIONS = frozenset(
    {
        "aiobk",
        "msgpack",
        "crc32c",
        "aetcd",
        "grpcio",
        "protobuf",
        "typing-extensions",
        "click",
        "obstore",
    }
)
VENV_SEEDS = frozenset({"pip", "setuptools"})
# The modules that are the servers' and the optional parts': everything else of the client,
# metadata, codec, bookie and autorecovery layers and of the commands imports without an extra.
SERVER_MODULES = ("aiobk.bookie.index.rocks", "aiobk.runner", "aiobk.metrics", "aiobk.http_admin")


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def _extra_names(extras: dict[str, list[str]], extra: str) -> set[str]:
    """The distributions ``extra`` brings on Linux, its own and those of the extras it names."""
    names: set[str] = set()
    for spec in extras[extra]:
        requirement = Requirement(spec)
        if canonicalize_name(requirement.name) == "aiobk":
            for inner in requirement.extras:
                names |= _extra_names(extras, inner)
        elif requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
            names.add(canonicalize_name(requirement.name))
    return names


@pytest.mark.timeout(10)
def test_the_base_install_is_the_client_and_the_extras_are_those_the_commands_name() -> None:
    project = _project()
    base = {canonicalize_name(Requirement(s).name) for s in project["dependencies"]}
    assert base == {"msgpack", "crc32c", "aetcd", "click", "obstore"}
    extras: dict[str, list[str]] = project["optional-dependencies"]
    # docs and dev are for people working on aiobk, not for users of it.
    assert set(extras) == {*EXTRAS, "all", "docs", "dev"}
    for extra, names in EXTRAS.items():
        assert _extra_names(extras, extra) == {canonicalize_name(n) for n in names}, extra
    assert _extra_names(extras, "all") == {canonicalize_name(n) for d in EXTRAS.values() for n in d}


def _fresh_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("AIOBK_METADATA", None)
    return env


# Run by the fresh venv's interpreter: a ledger and a log, written and read back.
CLIENT_SCRIPT = """
import asyncio, importlib, json, pkgutil, sys
import aiobk
from aiobk import BookKeeper, LogPosition, LogRecord

async def main(uri):
    async with await BookKeeper.connect(uri) as bk:
        lh = await bk.create_ledger(3, 3, 2)
        for i in range(5):
            await lh.append(b"entry %d" % i)
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id)
        entries = [e.data.decode() for e in await rh.read(0, 4)]
        await rh.close()
        writer = await bk.open_log_writer("slim")
        positions = [str(await writer.append(b"record %d" % i)) for i in range(3)]
        await writer.close()
        reader = await bk.open_log_reader("slim", follow=False)
        records = [r async for r in reader]
    unimportable = []
    for name in ("aiobk.protocol", "aiobk.metadata", "aiobk.client", "aiobk.bookie",
                 "aiobk.autorecovery", "aiobk.commands"):
        package = importlib.import_module(name)
        for found in pkgutil.walk_packages(package.__path__, name + "."):
            try:
                importlib.import_module(found.name)
            except ImportError:
                unimportable.append(found.name)
    for name in ("aiobk.cli", "aiobk.runner", "aiobk.metrics", "aiobk.http_admin"):
        try:
            importlib.import_module(name)
        except ImportError:
            unimportable.append(name)
    spark = ""
    try:
        importlib.import_module("aiobk.pipeline")
    except ImportError as exc:
        spark = str(exc)
    print(json.dumps({
        "ledger": lh.ledger_id,
        "entries": entries,
        "positions": positions,
        "records": [r.data.decode() for r in records],
        "record_types": sorted({type(r).__name__ for r in records}),
        "record_repr": repr(records[0])[:10],
        "dir": dir(aiobk),
        "version": aiobk.__version__,
        "unimportable": unimportable,
        "spark": spark,
    }))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.timeout(240)
async def test_pip_install_alone_is_a_working_client(
    tmp_path: Path, etcd_server: EtcdProcess
) -> None:
    """``pip install aiobk`` into a fresh venv (its dependencies from the package index, or
    pip's cache): only the client's distributions, and with them a client that appends and
    reads on a real cluster (etcd and bookies of this venv), client commands that work, and
    server commands that name their extra in one line."""
    wheel = await asyncio.to_thread(_build_wheel, tmp_path)
    venv = tmp_path / "fresh"
    python, aiobk = venv / "bin" / "python", venv / "bin" / "aiobk"
    env = _fresh_env(venv)

    def run(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in args], capture_output=True, text=True, env=env, cwd=tmp_path,
            timeout=timeout, check=False,
        )  # fmt: skip

    made = await asyncio.to_thread(run, sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    installed = await asyncio.to_thread(
        run, python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel,
        timeout=180,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr

    listed = await asyncio.to_thread(run, python, "-m", "pip", "list", "--format=json")
    names = {canonicalize_name(d["name"]) for d in json.loads(listed.stdout)}
    assert names - VENV_SEEDS <= CLIENT_DISTRIBUTIONS, sorted(names - VENV_SEEDS)
    assert {"aiobk", "msgpack", "crc32c", "aetcd", "click", "obstore"} <= names

    cluster = await start_cluster(tmp_path / "cluster", 3, uri=etcd_server.uri(unique_name("slim")))
    try:
        client = await asyncio.to_thread(run, python, "-I", "-c", CLIENT_SCRIPT, cluster.uri)
        assert client.returncode == 0, client.stderr
        out = json.loads(client.stdout)
        assert out["entries"] == [f"entry {i}" for i in range(5)]
        assert out["records"] == [f"record {i}" for i in range(3)]
        assert out["record_types"] == ["LogRecord"]
        assert out["record_repr"] == "LogRecord("
        assert "__version__" in out["dir"]
        assert "LogRecord" in out["dir"]
        assert out["unimportable"] == list(SERVER_MODULES), out["unimportable"]
        assert out["spark"].startswith(
            "aiobk.pipeline needs the spark extra: pip install 'aiobk[spark]' ("
        ), out["spark"]

        version = await asyncio.to_thread(run, aiobk, "--version")
        assert version.stdout == f"aiobk {out['version']}\n"
        bookies = await asyncio.to_thread(
            run, aiobk, "bookies", "list", "--json", "--metadata", cluster.uri
        )
        assert bookies.returncode == 0, bookies.stderr
        assert sorted(b["id"] for b in json.loads(bookies.stdout)) == sorted(
            b.bookie_id for b in cluster.bookies
        )
        read = await asyncio.to_thread(
            run, aiobk, "ledger", "read", str(out["ledger"]), "--metadata", cluster.uri
        )
        assert read.returncode == 0, read.stderr
        assert read.stdout.splitlines() == [f"{i}\tentry {i}" for i in range(5)]
        tail = await asyncio.to_thread(run, aiobk, "log", "tail", "slim", "--metadata", cluster.uri)
        assert tail.returncode == 0, tail.stderr
        # POSITION, TIME, KEY, HEADERS, DATA: envelope records, the default.
        assert [line.split("\t")[4] for line in tail.stdout.splitlines()] == out["records"]
    finally:
        await cluster.stop()

    refusals = [
        (["bookie", "start", "--data-dir", str(tmp_path / "b")], "aiobk bookie start", "bookie"),
        (["standalone"], "aiobk standalone", "bookie"),
        (["autorecovery", "start", "--metadata", "etcd://127.0.0.1:1/x"],
         "aiobk autorecovery start", "bookie"),
        (["bench", "add", "--bookies", "3"], "aiobk bench add", "bench"),
    ]  # fmt: skip
    for args, command, extra in refusals:
        refused = await asyncio.to_thread(run, aiobk, *args)
        assert refused.returncode == 1, (args, refused.stderr)
        assert refused.stdout == ""
        (line,) = refused.stderr.splitlines()
        assert line.startswith(
            f"aiobk: error: {command} needs the {extra} extra: pip install 'aiobk[{extra}]' "
        ), line
