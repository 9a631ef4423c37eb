"""Shared fixtures: real bookies on free loopback ports with temporary directories, the
session's etcd, and the session's S3 server (moto) for object stores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from aiobk.bookie import Bookie, BookieConfig
from aiobk.client import BookieConnection
from aiobk.metadata import EtcdProcess, MemoryKV, MetadataStore, open_store
from aiobk.runner import make_bookie
from tests.support.cluster import Cluster, start_cluster, stop_all
from tests.support.loops import new_event_loop
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS
from tests.support.s3server import S3Server

BookieFactory = Callable[..., Awaitable[Bookie]]

# Property tests judge what they check, not how fast this machine draws examples: a shared
# 2-core machine under a full suite drew five examples a second and failed the health check.
# Every test has a timeout of its own (pytest-timeout) instead of a per-example deadline.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    """Tests run on uvloop, the loop production uses (closed by ``tests.support.loops``)."""
    return {"uvloop": new_event_loop}


@pytest.fixture(autouse=True)
def _tmp_path_first(request: pytest.FixtureRequest) -> None:
    """Set a test's ``tmp_path`` up before its other fixtures, so it is torn down after them.

    A passing test's directory is removed when ``tmp_path`` is torn down (the suite keeps only
    failing tests' directories). Fixtures tear down in the reverse of their set-up order, so a
    fixture asked for before ``tmp_path`` -- a list of clusters stopped at the end -- would
    otherwise stop its bookies after their directories were gone, and their last index flush
    would fail to create its file."""
    if "tmp_path" in request.fixturenames:
        request.getfixturevalue("tmp_path")


@pytest.fixture
async def start_bookie(tmp_path: Path) -> AsyncIterator[BookieFactory]:
    """Start bookies (port 0, own data dir unless given); all are stopped at the end."""
    started: list[Bookie] = []
    counter = 0

    async def start(data_dir: Path | None = None, **settings: Any) -> Bookie:
        nonlocal counter
        counter += 1
        directory = data_dir or tmp_path / f"bookie{counter}"
        config = BookieConfig(
            data_dir=str(directory),
            port=settings.pop("port", 0),
            **{**HOST_DISK_SETTINGS, **settings},
        )
        bookie = make_bookie(config)  # as the wiring builds it: with the repairer
        await bookie.start()
        started.append(bookie)
        return bookie

    yield start
    await stop_all(started)


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[Bookie], Awaitable[BookieConnection]]]:
    opened: list[BookieConnection] = []

    async def open_to(bookie: Bookie) -> BookieConnection:
        conn = await BookieConnection.open(bookie.address.host, bookie.address.port)
        opened.append(conn)
        return conn

    yield open_to
    for conn in opened:
        conn.close()
    await asyncio.sleep(0)


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdProcess]:
    """One real etcd for the whole session, on free loopback ports, in a temporary dir."""
    server = EtcdProcess().start()
    yield server
    server.stop()


@pytest.fixture(params=["memory", "etcd"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[MetadataStore]:
    """A fresh, empty store of each kind (the etcd one under its own prefix)."""
    if request.param == "memory":
        name = unique_name("contract")
        opened = open_store(f"memory://{name}")
        yield opened
        await opened.close()
        MemoryKV.forget(name)
    else:
        server: EtcdProcess = request.getfixturevalue("etcd_server")
        opened = open_store(server.uri(unique_name("contract")))
        yield opened
        await opened.close()


@pytest.fixture
async def etcd_cluster(etcd_server: EtcdProcess, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Three in-process bookies registered in the session's etcd, which the CLI reaches."""
    cluster = await start_cluster(tmp_path, 3, uri=etcd_server.uri(unique_name("cli")))
    try:
        yield cluster
    finally:
        await cluster.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto on a free loopback port, with fake keys in the environment for the session."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with pytest.MonkeyPatch.context() as patch, S3Server(log) as server:
        for name, value in server.environ.items():
            patch.setenv(name, value)
        yield server
