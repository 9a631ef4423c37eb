"""Fixtures of the compatibility suite: the newest release's source tree, its bookies as
processes, this tree's bookies and client in process, all on one real etcd."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aiobk import BookKeeper, ClientConfig
from aiobk.bookie import Bookie
from aiobk.metadata import EtcdProcess, open_store
from tests.compat.harness import (
    Release,
    ReleaseUnavailableError,
    head_bookie,
    materialise,
    newest_release,
    start_processes,
)
from tests.support.names import unique_name
from tests.support.procs import BookieProcess

# Short enough that a step against a stopped bookie fails within a test's time.
CLIENT_CONFIG: dict[str, Any] = {
    "add_timeout": 5.0,
    "read_timeout": 2.0,
    "connect_timeout": 1.0,
    "metadata_retry_timeout": 10.0,
}


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The newest release in releases.toml, materialised from git history. Not in this
    clone's history: every test of the suite fails, with the reason on one line."""
    try:
        version, commit = newest_release()
        tree = materialise(version, commit, tmp_path_factory.mktemp(f"release-{version}"))
        found = Release(version, commit, tree)
        found.check_import()
    except ReleaseUnavailableError as exc:
        reason = str(exc)
    else:
        return found
    pytest.fail(reason, pytrace=False)


@pytest.fixture
def uri(etcd_server: EtcdProcess) -> str:
    """A metadata URI of its own for the test, on the session's etcd."""
    return etcd_server.uri(unique_name("compat"))


@pytest.fixture
def release_bookies(
    release: Release, uri: str, tmp_path: Path
) -> Iterator[Callable[..., Awaitable[list[BookieProcess]]]]:
    """Start ``count`` bookies of the release as processes (each ``args`` passed to
    ``bookie start``); all killed at the end."""
    started: list[BookieProcess] = []

    async def start(count: int = 3, *args: str) -> list[BookieProcess]:
        first = len(started)
        bookies = [
            release.bookie(tmp_path / f"release-bookie{first + i}", uri, *args)
            for i in range(count)
        ]
        started.extend(bookies)
        await start_processes(bookies)
        return bookies

    yield start
    for bookie in started:
        bookie.stop()


@pytest.fixture
async def head_bookies(
    uri: str, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[list[Bookie]]]]:
    """Start ``count`` bookies of this tree in process; all stopped at the end."""
    started: list[Bookie] = []

    async def start(count: int = 3, **settings: Any) -> list[Bookie]:
        bookies = []
        for _ in range(count):
            data_dir = settings.pop("data_dir", None) or tmp_path / f"head-bookie{len(started)}"
            bookie = await head_bookie(data_dir, uri, **settings)
            started.append(bookie)
            bookies.append(bookie)
        return bookies

    yield start
    for bookie in started:
        await bookie.stop()


@pytest.fixture
async def client(uri: str) -> AsyncIterator[BookKeeper]:
    """This tree's client. Made on the URI's store, not the URI: it connects before the test
    starts the bookies that make the prefix a cluster (a URI is checked for one; the check on a
    release's cluster is in test_wire.py)."""
    async with (
        open_store(uri) as store,
        await BookKeeper.connect(store, config=ClientConfig(**CLIENT_CONFIG)) as bk,
    ):
        yield bk
