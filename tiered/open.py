"""Opening an object store by URL, the URL a ledger's metadata may record, and the stores a
client keeps open.

``file:///ABS/DIR`` is a directory store (tiered/file.py), ``s3://BUCKET/PREFIX?endpoint=URL
&region=R[&credentials=instance]`` an S3 store (tiered/s3.py). Anything else, or a URL that
says too little, is refused with one line before any I/O: a wrong URL in the cluster's settings
shows up when it is set, not when the first offload runs. Secrets never travel in the URL (S3
keys come from the environment), and ``redact`` strips any a user put there anyway, so what
metadata and messages show is safe to show.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from aiobk.tiered.file import DirectoryStore
from aiobk.tiered.s3 import S3Location, S3ObjectStore, keys_from
from aiobk.tiered.store import ObjectStore

DEFAULT_TIMEOUT = 30.0
S3_OPTIONS = frozenset({"endpoint", "region", "credentials"})
# Query parameter names that carry secrets when their name contains one of these.
SECRET_WORDS = ("secret", "password", "passwd", "token", "key", "signature", "sig", "credential")


def _without_userinfo(netloc: str) -> str:
    return netloc.rpartition("@")[2]


def redact(url: str) -> str:
    """``url`` without user information or secret query parameters (``credentials=instance``
    stays: it names where keys come from, not a key), also inside an ``endpoint`` parameter."""
    parts = urlsplit(url)
    query = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        lowered = name.lower()
        if lowered == "credentials" and value == "instance":
            query.append((name, value))
        elif any(word in lowered for word in SECRET_WORDS):
            continue
        elif lowered == "endpoint":
            query.append((name, redact(value)))
        else:
            query.append((name, value))
    netloc = _without_userinfo(parts.netloc)
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe=":/"), ""))


def open_object_store(
    url: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    environ: Mapping[str, str] | None = None,
) -> ObjectStore:
    """The store ``url`` names; ValueError (one line, the URL redacted) when it names none.
    Every call of the store is bounded by ``timeout`` seconds. S3 keys come from ``environ``
    (the process's environment by default)."""
    shown = redact(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"{shown}: not a URL ({exc})") from None
    if timeout <= 0:
        raise ValueError(f"{shown}: the timeout must be positive, not {timeout}")
    if parts.scheme == "file":
        return _directory(shown, parts.netloc, parts.path, parts.query, timeout)
    if parts.scheme == "s3":
        location = _s3_location(shown, parts.netloc, parts.path, parts.query)
        keys = keys_from(os.environ if environ is None else environ, location)
        return S3ObjectStore(location, keys, timeout=timeout)
    raise ValueError(f"{shown}: not an object store URL (file:///DIR or s3://BUCKET/PREFIX)")


def _directory(shown: str, netloc: str, path: str, query: str, timeout: float) -> DirectoryStore:
    if netloc not in {"", "localhost"} or query:
        raise ValueError(f"{shown}: a directory store's URL is file:///ABSOLUTE/DIRECTORY")
    directory = unquote(path)
    if not directory.startswith("/"):
        raise ValueError(f"{shown}: the directory must be absolute (file:///ABSOLUTE/DIRECTORY)")
    directory = os.path.normpath(directory)
    return DirectoryStore(directory, timeout=timeout)


def _s3_location(shown: str, netloc: str, path: str, query: str) -> S3Location:
    if "@" in netloc:
        raise ValueError(f"{shown}: S3 keys come from the environment, not the URL")
    bucket = netloc
    if not bucket:
        raise ValueError(f"{shown}: no bucket (s3://BUCKET/PREFIX?endpoint=URL&region=R)")
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in S3_OPTIONS:
            raise ValueError(f"{shown}: unknown option {name!r} (endpoint, region, credentials)")
        if name in options:
            raise ValueError(f"{shown}: option {name!r} given twice")
        options[name] = value
    endpoint = options.get("endpoint")
    if endpoint is not None:
        scheme = urlsplit(endpoint).scheme
        if scheme not in {"http", "https"} or not urlsplit(endpoint).netloc:
            raise ValueError(f"{shown}: the endpoint must be an http:// or https:// URL")
        endpoint = endpoint.rstrip("/")
    credentials = options.get("credentials")
    if credentials not in {None, "instance"}:
        raise ValueError(f"{shown}: credentials=instance is the only choice of credentials")
    prefix = unquote(path).strip("/")
    if prefix and any(part in {"", ".", ".."} for part in prefix.split("/")):
        raise ValueError(f"{shown}: the prefix {prefix!r} has an empty, '.' or '..' part")
    return S3Location(
        bucket=bucket,
        prefix=prefix,
        endpoint=endpoint,
        region=options.get("region") or "us-east-1",
        instance_credentials=credentials == "instance",
    )


class StoreCache:
    """One open store per URL, shared by a client; ``close`` closes them all."""

    def __init__(self, opener: Callable[[str], ObjectStore] = open_object_store) -> None:
        self._opener = opener
        self._stores: dict[str, ObjectStore] = {}

    def get(self, url: str) -> ObjectStore:
        """The store of ``url``, opened on first use (ValueError when ``url`` names none)."""
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = self._opener(url)
        return store

    async def close(self) -> None:
        """Close every store opened, each even when another's close fails."""
        stores, self._stores = list(self._stores.values()), {}
        failure: BaseException | None = None
        for store in stores:
            try:
                await store.close()
            except Exception as exc:  # every store is closed, then the first failure raised
                failure = failure or exc
        if failure is not None:
            raise failure


__all__ = ["DEFAULT_TIMEOUT", "StoreCache", "open_object_store", "redact"]
