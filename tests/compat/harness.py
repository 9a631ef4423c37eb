"""A release's code beside this tree's: its source from git history, its client and bookies run
as child processes of the same interpreter with ``PYTHONPATH`` pointing into it.

``releases.toml`` (beside this file) names each release's commit, since tags may not travel
with a clone; the suite tests this tree against the newest release listed there.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiobk.bookie import Bookie, BookieConfig
from aiobk.runner import make_bookie
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess, bookie_module

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RELEASES = HERE / "releases.toml"
DRIVER = HERE / "driver.py"
HEX = "0123456789abcdef"

# Every bookie of the suite, either version: the host's disk settings (tests.support.procs), and no
# autorecovery, which would start copying ledgers of the bookies a test stops on purpose.
BOOKIE_SETTINGS: dict[str, Any] = {**HOST_DISK_SETTINGS, "autorecovery_enabled": False}


class ReleaseUnavailableError(Exception):
    """The release named in releases.toml cannot be materialised from this clone."""


def _version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        raise ReleaseUnavailableError(
            f"{RELEASES.name}: release {version!r} is not a dotted number"
        ) from None


def newest_release(path: Path = RELEASES) -> tuple[str, str]:
    """(version, commit) of the newest release listed in ``path``."""
    releases = tomllib.loads(path.read_text())["releases"]
    if not releases:
        raise ReleaseUnavailableError(f"{path.name}: no release listed")
    version = max(releases, key=_version_key)
    commit = releases[version]
    if not (isinstance(commit, str) and len(commit) == 40 and set(commit) <= set(HEX)):
        raise ReleaseUnavailableError(
            f"{path.name}: release {version}: {commit!r} is not a full 40-digit commit id"
        )
    return version, commit


def materialise(version: str, commit: str, dest: Path) -> Path:
    """The source tree of ``commit`` in ``dest`` (``git archive | tar -x``: symlinks kept)."""
    try:
        check = subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
            check=False,
            timeout=30,
        )
    except OSError as exc:
        raise ReleaseUnavailableError(f"release {version}: cannot run git: {exc}") from None
    if check.returncode != 0:
        raise ReleaseUnavailableError(
            f"release {version}: commit {commit} is not in this clone's git history "
            f"({ROOT}); fetch it (a full clone, not --depth)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit], stdout=subprocess.PIPE
    ) as archive:
        extract = subprocess.run(
            ["tar", "-x", "-C", str(dest)],
            stdin=archive.stdout,
            capture_output=True,
            check=False,
            timeout=120,
        )
    if archive.returncode != 0 or extract.returncode != 0:
        raise ReleaseUnavailableError(
            f"release {version}: extracting commit {commit} failed: {extract.stderr.decode()}"
        )
    return dest


@dataclass
class Release:
    """The release's source tree and how to run its code."""

    version: str
    commit: str
    tree: Path
    _settings: set[str] | None = field(default=None, repr=False)

    @property
    def env(self) -> dict[str, str]:
        """What makes the venv's interpreter import ``aiobk`` from the release's tree (and
        not from the working directory, nor this tree's editable install)."""
        return {"PYTHONPATH": str(self.tree), "PYTHONSAFEPATH": "1"}

    def python(self, code: str, timeout: float = 60) -> str:
        """Run ``code`` with the release's ``aiobk``; its stdout."""
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=dict(os.environ, **self.env),
            capture_output=True,
            check=False,
            timeout=timeout,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"release {self.version}: {code!r} failed:\n{done.stderr}")
        return done.stdout

    def check_import(self) -> None:
        """The child imports the release's ``aiobk``, not this tree's."""
        try:
            found = self.python("import aiobk.client, aiobk.bookie; print(aiobk.__file__)")
        except RuntimeError as exc:
            last = str(exc).strip().splitlines()[-1]
            raise ReleaseUnavailableError(
                f"release {self.version}: its aiobk does not import here: {last}"
            ) from None
        where = Path(found.strip()).resolve()
        if not where.is_relative_to(self.tree.resolve()):
            raise ReleaseUnavailableError(
                f"release {self.version}: aiobk imports from {where}, not from {self.tree}"
            )

    @property
    def bookie_settings(self) -> set[str]:
        """The settings the release's ``BookieConfig`` knows."""
        if self._settings is None:
            module = f"{bookie_module(self.tree)}.config"
            code = (
                f"import dataclasses, {module} as c; "
                "print(' '.join(f.name for f in dataclasses.fields(c.BookieConfig)))"
            )
            self._settings = set(self.python(code).split())
        return self._settings

    async def run(
        self, uri: str, steps: list[dict[str, Any]], config: dict[str, Any] | None = None,
        timeout: float = 60,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Run a script of client steps (tests/compat/driver.py) with the release's client;
        the steps' results. AssertionError, with the driver's error and stderr, when a step
        that was not expected to fail raised."""
        script = json.dumps({"metadata": uri, "config": config or {}, "steps": steps})
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(DRIVER),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=dict(os.environ, **self.env),
        )  # fmt: skip
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(script.encode()), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        lines = stdout.decode().splitlines()
        output = json.loads(lines[-1]) if lines else {}
        if process.returncode != 0 or "error" in output:
            raise AssertionError(
                f"release {self.version} client: {output.get('error', 'no result')} "
                f"(exit {process.returncode})\n{stderr.decode()[-4000:]}"
            )
        results: list[dict[str, Any]] = output["results"]
        return results

    def bookie(
        self, data_dir: Path, uri: str, *args: str, port: int | None = None
    ) -> BookieProcess:
        """A bookie of the release as a process (``python -m aiobk.bookie start``), with
        ``BOOKIE_SETTINGS`` the release knows in its settings file; not started."""
        config = data_dir.parent / f"{data_dir.name}.toml"
        known = self.bookie_settings
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            "".join(f"{k} = {_toml(v)}\n" for k, v in BOOKIE_SETTINGS.items() if k in known)
        )
        return BookieProcess(
            data_dir, port, "--config", str(config), "--metadata", uri, *args,
            env=self.env, module=bookie_module(self.tree),
        )  # fmt: skip


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


async def start_processes(bookies: Iterable[BookieProcess]) -> None:
    await asyncio.gather(*(bookie.start() for bookie in bookies))


def log_tail(bookie: BookieProcess, chars: int = 3000) -> str:
    try:
        return bookie.log_path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


async def head_bookie(data_dir: Path, uri: str, port: int = 0, **settings: Any) -> Bookie:
    """A bookie of this tree, in this process, as the wiring builds it; started."""
    config = BookieConfig(
        data_dir=str(data_dir), port=port, metadata_uri=uri, **{**BOOKIE_SETTINGS, **settings}
    )
    bookie = make_bookie(config)
    await bookie.start()
    return bookie
