"""Opening a store by URL: which store each URL names, the one-line refusals of the others, the
URL a store shows (no secrets), and the cache that keeps one open store per URL."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aiobk.protocol.errors import ObjectStoreError
from aiobk.tiered import (
    DirectoryStore,
    MemoryObjectStore,
    ObjectStore,
    S3ObjectStore,
    StoreCache,
    Upload,
    open_object_store,
    redact,
)
from tests.support.s3server import ENVIRON, S3Server

KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG"}


def _refused(url: str, *, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ValueError, match=": ") as refused:
        open_object_store(url, environ=KEYS if environ is None else environ)
    message = str(refused.value)
    assert "\n" not in message
    assert "wJalrXUtnFEMI" not in message
    return message


def test_a_file_url_opens_a_directory_store_and_makes_its_directory(tmp_path: Path) -> None:
    store = open_object_store(f"file://{tmp_path}/a/b/../c")
    assert isinstance(store, DirectoryStore)
    assert store.url == f"file://{tmp_path}/a/c"
    assert (tmp_path / "a" / "c").is_dir()
    assert open_object_store(f"file://localhost{tmp_path}").url == f"file://{tmp_path}"
    spaced = open_object_store(f"file://{tmp_path}/with%20space")
    assert spaced.url == f"file://{tmp_path}/with space"


def test_file_urls_refused(tmp_path: Path) -> None:
    assert "absolute" in _refused("file:relative/dir")
    assert "absolute" in _refused("file:")
    assert "file:///ABSOLUTE/DIRECTORY" in _refused("file://otherhost/dir")
    assert "file:///ABSOLUTE/DIRECTORY" in _refused(f"file://{tmp_path}?sync=no")
    (tmp_path / "plain").write_bytes(b"")
    assert "cannot create the directory" in _refused(f"file://{tmp_path}/plain/sub")
    assert "cannot create the directory: File exists" in _refused(f"file://{tmp_path}/plain")


def test_an_s3_url_opens_an_s3_store() -> None:
    url = "s3://bkt/offload/prod/?endpoint=http://127.0.0.1:9000/&region=eu-west-1"
    store = open_object_store(url, environ=KEYS)
    assert isinstance(store, S3ObjectStore)
    assert store.url == "s3://bkt/offload/prod?endpoint=http://127.0.0.1:9000&region=eu-west-1"
    location = store.location
    assert (location.bucket, location.prefix, location.region) == (
        "bkt",
        "offload/prod",
        "eu-west-1",
    )
    bare = open_object_store("s3://bkt", environ=KEYS)
    assert bare.url == "s3://bkt?region=us-east-1"
    assert isinstance(bare, S3ObjectStore)
    assert bare.location.prefix == ""
    assert "wJalrXUtnFEMI" not in repr(vars(bare))


def test_s3_urls_refused() -> None:
    assert "no bucket" in _refused("s3:///prefix?region=us-east-1")
    assert "no bucket" in _refused("s3://")
    assert "unknown option 'secret'" in _refused("s3://b/p?secret=x")
    assert "given twice" in _refused("s3://b/p?region=a&region=b")
    assert "http:// or https://" in _refused("s3://b/p?endpoint=ftp://h")
    assert "http:// or https://" in _refused("s3://b/p?endpoint=localhost:9000")
    assert "credentials=instance" in _refused("s3://b/p?credentials=static")
    assert "'..' part" in _refused("s3://b/p/../q")
    assert "environment, not the URL" in _refused("s3://AKID:wJalrXUtnFEMI@b/p")


def test_s3_without_keys_is_refused_unless_the_url_asks_for_the_instance_role() -> None:
    message = _refused("s3://b/p?region=us-east-1", environ={})
    assert "AWS_ACCESS_KEY_ID" in message
    assert "credentials=instance" in message
    assert "AWS_ACCESS_KEY_ID" in _refused("s3://b/p", environ={"AWS_ACCESS_KEY_ID": "AKID"})
    store = open_object_store("s3://b/p?credentials=instance", environ={})
    assert store.url == "s3://b/p?region=us-east-1&credentials=instance"


def test_other_schemes_and_bad_timeouts_are_refused(tmp_path: Path) -> None:
    assert "not an object store URL" in _refused("http://example.com/bucket")
    assert "not an object store URL" in _refused("gs://bucket/p")
    assert "not an object store URL" in _refused("/plain/path")
    assert "not an object store URL" in _refused("memory://store")
    with pytest.raises(ValueError, match="timeout must be positive"):
        open_object_store(f"file://{tmp_path}", timeout=0)


def test_keys_that_name_no_object_are_refused(tmp_path: Path) -> None:
    store = open_object_store(f"file://{tmp_path}")
    for key in ["", "/abs", "a//b", "a/./b", "../up", "a/..", "a/b#1", "back\\slash"]:
        with pytest.raises(ValueError, match="is not an object key"):
            store._path(key)  # type: ignore[attr-defined]


def test_redact_removes_user_information_and_secret_parameters() -> None:
    url = (
        "s3://AKID:wJalrXUtnFEMI@bkt/p?endpoint=http://user:pw@127.0.0.1:9000"
        "&region=us-east-1&aws_secret_access_key=zz&Token=t&X-Amz-Signature=s"
        "&password=p&credentials=instance"
    )
    assert redact(url) == (
        "s3://bkt/p?endpoint=http://127.0.0.1:9000&region=us-east-1&credentials=instance"
    )
    assert redact("file:///var/objects") == "file:///var/objects"
    assert redact("s3://bkt/p?region=us-east-1") == "s3://bkt/p?region=us-east-1"
    assert redact("s3://bkt?credentials=sekrit") == "s3://bkt"
    message = _refused("gs://AKID:wJalrXUtnFEMI@bkt/p?secret=zz")
    assert "AKID" not in message
    assert "zz" not in message


class _Recorded(MemoryObjectStore):
    closed = 0

    async def close(self) -> None:
        self.closed += 1


async def test_the_cache_opens_one_store_per_url_and_closes_them_all() -> None:
    opened: list[str] = []

    def opener(url: str) -> ObjectStore:
        opened.append(url)
        return _Recorded(url)

    cache = StoreCache(opener)
    first = cache.get("memory://a")
    assert cache.get("memory://a") is first
    second = cache.get("memory://b")
    assert second is not first
    assert opened == ["memory://a", "memory://b"]
    await cache.close()
    assert isinstance(first, _Recorded)
    assert isinstance(second, _Recorded)
    assert (first.closed, second.closed) == (1, 1)
    assert cache.get("memory://a") is not first  # after close: opened afresh
    await cache.close()


async def test_the_default_cache_opens_by_url(tmp_path: Path) -> None:
    cache = StoreCache()
    store = cache.get(f"file://{tmp_path}")
    assert isinstance(store, DirectoryStore)
    assert cache.get(f"file://{tmp_path}") is store
    with pytest.raises(ValueError, match="not an object store URL"):
        cache.get("ftp://x")
    await cache.close()


async def test_sweeping_s3_uploads_without_aiobotocore_names_the_bookie_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_aiobotocore(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("aiobotocore"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_aiobotocore)
    store = open_object_store("s3://b/p?endpoint=http://127.0.0.1:9&region=r", environ=KEYS)
    for call in (store.uploads(""), store.abort(Upload("k", "id"))):
        with pytest.raises(ObjectStoreError) as refused:
            await call
        assert str(refused.value) == (
            "s3://b/p?endpoint=http://127.0.0.1:9&region=r: "
            + ("list uploads" if "uploads" in str(refused.value) else "abort k")
            + " needs the bookie extra: pip install 'aiobk[bookie]' (not installed: aiobotocore)"
        )


def test_opening_a_store_does_not_import_aiobotocore(s3_server: S3Server) -> None:
    """aiobotocore is the bookie extra's: a client reading objects never needs it."""
    url = s3_server.bucket_url("noboto")
    probe = (
        "import sys, asyncio; from aiobk.tiered import open_object_store\n"
        f"store = open_object_store({url!r})\n"
        "asyncio.run(store.size('x'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'aiobotocore', 'botocore'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True, text=True, check=True, timeout=60, env={**os.environ, **ENVIRON},
    )  # fmt: skip
    assert out.stdout.strip() == "[]"
