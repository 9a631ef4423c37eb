"""A real cluster (etcd and three bookie processes) and a local[2] Spark session, one each per
test process: Spark's Python workers are separate processes and connect over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from aiobk.metadata import EtcdProcess
from aiobk.pipeline import local_session
from tests.support.procs import BookieProcess


@pytest.fixture(scope="session")
def cluster_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("spark-cluster")
    etcd = EtcdProcess(data_dir=str(root / "etcd")).start()
    uri = etcd.uri("spark")
    bookies = [BookieProcess(root / f"bookie{i}", None, "--metadata", uri) for i in range(3)]
    try:
        asyncio.run(_start(bookies))
        yield uri
    finally:
        for bookie in bookies:
            bookie.stop()
        etcd.stop()


async def _start(bookies: list[BookieProcess]) -> None:
    await asyncio.gather(*(b.start() for b in bookies))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_session("aiobk-tests")
    yield session
    session.stop()
