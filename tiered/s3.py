"""The S3 store (``s3://BUCKET/PREFIX?endpoint=URL&region=R``): objects in any S3-compatible
bucket, under a key prefix.

Data goes through obstore's ``S3Store`` (path-style requests; plain http allowed only for an
http endpoint): a ``put`` streams as a multipart upload, ranged reads may be coalesced. The
keys come from the given environment, never from a machine's instance metadata, unless the URL
says ``credentials=instance``: with static keys obstore builds no instance-metadata provider,
so nothing here talks to 169.254.169.254 unasked. obstore cannot list or abort incomplete
multipart uploads (the leftovers of a killed put), so ``uploads`` and ``abort`` use aiobotocore,
imported only then: it is in the bookie extra, which the process sweeping them has.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import obstore
from obstore.store import S3Store

from aiobk.protocol.errors import ObjectStoreError
from aiobk.tiered.bounded import (
    ObstoreCalls,
    StreamedPut,
    bounded,
    check_key,
    parent,
)
from aiobk.tiered.store import Upload

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config

# obstore's default part size: objects larger than this are uploaded in parts.
PART_SIZE = 5 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class S3Location:
    """Where an S3 store's objects are and how to reach them (no secrets)."""

    bucket: str
    prefix: str  # "" or ends without "/"
    endpoint: str | None
    region: str
    instance_credentials: bool = False

    @property
    def url(self) -> str:
        """The store's URL, secrets left out."""
        query = [f"region={self.region}"]
        if self.endpoint is not None:
            query.insert(0, f"endpoint={self.endpoint}")
        if self.instance_credentials:
            query.append("credentials=instance")
        path = f"/{self.prefix}" if self.prefix else ""
        return f"s3://{self.bucket}{path}?{'&'.join(query)}"


@dataclass(frozen=True, slots=True)
class S3Keys:
    """Static credentials."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:
        return f"S3Keys(access_key_id={self.access_key_id!r}, ...)"


def keys_from(environ: Mapping[str, str], location: S3Location) -> S3Keys | None:
    """The keys ``environ`` holds; None for ``credentials=instance``; ValueError when missing."""
    if location.instance_credentials:
        return None
    key_id = environ.get("AWS_ACCESS_KEY_ID")
    secret = environ.get("AWS_SECRET_ACCESS_KEY")
    if not key_id or not secret:
        raise ValueError(
            f"{location.url}: no AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment "
            "(add credentials=instance to the URL to use the machine's role)"
        )
    return S3Keys(key_id, secret, environ.get("AWS_SESSION_TOKEN") or None)


class S3ObjectStore(ObstoreCalls):
    """Objects under ``location.prefix`` in ``location.bucket``."""

    def __init__(self, location: S3Location, keys: S3Keys | None, *, timeout: float = 30.0) -> None:
        self._location = location
        self._keys = keys
        self._timeout = timeout
        self._url = location.url
        config: S3Config = {
            "region": location.region,
            "virtual_hosted_style_request": False,
        }
        if location.endpoint is not None:
            config["endpoint"] = location.endpoint
        if keys is not None:
            config["access_key_id"] = keys.access_key_id
            config["secret_access_key"] = keys.secret_access_key
            if keys.session_token is not None:
                config["session_token"] = keys.session_token
        limit = timedelta(seconds=timeout)
        client: ClientConfig = {"timeout": limit, "connect_timeout": limit}
        if location.endpoint is not None and location.endpoint.startswith("http://"):
            client["allow_http"] = True
        retry: RetryConfig = {"max_retries": 3, "retry_timeout": limit}
        self._hold(
            S3Store(
                location.bucket,
                prefix=location.prefix or None,
                config=config,
                client_options=client,
                retry_config=retry,
            )
        )

    @property
    def url(self) -> str:
        return self._url

    @property
    def location(self) -> S3Location:
        """The bucket, prefix, endpoint and region."""
        return self._location

    async def put(self, key: str, chunks: AsyncIterable[bytes | bytearray]) -> int:
        path = check_key(self._url, key)
        streamed = StreamedPut(self._url, key, self._timeout, chunks)
        return await streamed.run(
            lambda feed: obstore.put_async(self._store, path, feed, chunk_size=PART_SIZE)
        )

    def keys(self, prefix: str) -> AsyncIterator[str]:
        return self._listed(prefix, parent(prefix))

    def _full_key(self, key: str) -> str:
        return f"{self._location.prefix}/{key}" if self._location.prefix else key

    async def uploads(self, prefix: str) -> list[Upload]:
        skip = len(self._full_key(""))
        found: list[Upload] = []
        async with self._client("list uploads") as client:
            paginator = client.get_paginator("list_multipart_uploads")
            pages = paginator.paginate(Bucket=self._location.bucket, Prefix=self._full_key(prefix))
            async for page in pages:
                found.extend(
                    Upload(u["Key"][skip:], u["UploadId"]) for u in page.get("Uploads", [])
                )
        return sorted(found, key=lambda upload: (upload.key, upload.upload_id))

    async def abort(self, upload: Upload) -> None:
        key = self._full_key(check_key(self._url, upload.key))
        async with self._client(f"abort {upload.key}") as client:
            try:
                await client.abort_multipart_upload(
                    Bucket=self._location.bucket, Key=key, UploadId=upload.upload_id
                )
            except client.exceptions.NoSuchUpload:
                return

    @asynccontextmanager
    async def _client(self, operation: str) -> AsyncIterator[Any]:
        """An aiobotocore S3 client for one call, bounded and translated like every call."""
        try:
            from aiobotocore.config import AioConfig  # noqa: PLC0415 - bookie extra
            from aiobotocore.session import get_session  # noqa: PLC0415 - bookie extra
        except ImportError:
            raise ObjectStoreError(
                f"{self._url}: {operation} needs the bookie extra: "
                "pip install 'aiobk[bookie]' (not installed: aiobotocore)"
            ) from None
        async with bounded(self._url, operation, self._timeout):
            session = get_session()
            if self._keys is not None:  # static keys: no provider chain, no instance metadata
                keys = self._keys
                session.set_credentials(
                    keys.access_key_id, keys.secret_access_key, keys.session_token
                )
            config = AioConfig(
                s3={"addressing_style": "path"},
                connect_timeout=self._timeout,
                read_timeout=self._timeout,
                retries={"max_attempts": 2},
            )
            async with session.create_client(
                "s3",
                endpoint_url=self._location.endpoint,
                region_name=self._location.region,
                config=config,
            ) as client:
                yield client


__all__ = ["PART_SIZE", "S3Keys", "S3Location", "S3ObjectStore", "keys_from"]
