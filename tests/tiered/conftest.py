"""Object stores for the tiered tests: the store in memory, a directory store on the test's
directory, and an S3 store on the moto server the session shares (``s3_server``,
tests/conftest.py; a fresh bucket per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.tiered import MemoryObjectStore, ObjectStore, open_object_store
from tests.support.names import unique_name
from tests.support.s3server import S3Server

BACKENDS = ["memory", "directory", "s3"]


@pytest.fixture
def s3_url(s3_server: S3Server) -> str:
    """The URL of a store in a bucket of its own, under a prefix."""
    return s3_server.bucket_url(unique_name("bucket-"), "offload/test")


@pytest.fixture(params=BACKENDS)
async def object_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[ObjectStore]:
    """Each backend in turn, closed at the end."""
    store: ObjectStore
    if request.param == "memory":
        store = MemoryObjectStore()
    elif request.param == "directory":
        store = open_object_store(f"file://{tmp_path / 'objects'}")
    else:
        store = open_object_store(request.getfixturevalue("s3_url"))
    yield store
    await store.close()
