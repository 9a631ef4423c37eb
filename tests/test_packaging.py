"""The project's metadata builds without a setuptools warning (the `project.license` table
form was deprecated and warned on every install)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_applies_without_a_setuptools_warning(monkeypatch) -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # package discovery and the readme are relative to the project
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # setuptools reports deprecations as warnings
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"


LAYERS = ("protocol", "metadata", "bookie", "client", "autorecovery", "pipeline", "bench")


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


@pytest.mark.timeout(300)
def test_the_wheel_installs_one_top_level_name_aiobk(tmp_path: Path) -> None:
    """A pip install puts exactly one top-level name, ``aiobk``, into site-packages,
    holding every layer as real files (the build follows aiobk/'s symlinks)."""
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
