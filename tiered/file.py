"""The directory store (``file:///ABS/DIR``): objects as files under one directory.

Reads, listings and deletes go through obstore's ``LocalStore``. A ``put`` writes its own
staging file ``KEY#N`` beside the object (the name ``LocalStore`` gives its own, so a listing
skips both), fsyncs it, renames it over ``KEY`` and fsyncs the directory: the object appears
whole and durable, or not at all (``LocalStore`` renames without an fsync, so a power loss could
publish a torn file). A staging file a killed put leaves is an ``Upload``: ``uploads`` finds it
and ``abort`` removes it. Every step is bounded by the store's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from obstore.store import LocalStore

from aiobk.protocol.errors import ObjectStoreError
from aiobk.tiered.bounded import (
    STAGING_SUFFIX,
    ObstoreCalls,
    call,
    check_key,
    parent,
)
from aiobk.tiered.store import Upload

T = TypeVar("T")

# Chunks are gathered to this size before a thread writes them: fewer thread hops for small
# chunks, and memory bounded for large objects.
WRITE_BATCH = 1024 * 1024


class DirectoryStore(ObstoreCalls):
    """Objects as files under ``root`` (an absolute directory, created when missing)."""

    def __init__(self, root: str, *, timeout: float = 30.0) -> None:
        path = Path(root)
        if not path.is_absolute():
            raise ValueError(f"file:// store needs an absolute directory, not {root!r}")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            message = f"file://{root}: cannot create the directory: {exc.strerror}"
            raise ValueError(message) from None
        self._root = path
        self._url = f"file://{path}"
        self._timeout = timeout
        self._hold(LocalStore(path))

    @property
    def url(self) -> str:
        return self._url

    @property
    def root(self) -> Path:
        """The directory the objects are in."""
        return self._root

    def _path(self, key: str) -> Path:
        return self._root / check_key(self._url, key)

    async def put(self, key: str, chunks: AsyncIterable[bytes | bytearray]) -> int:
        target = self._path(key)
        writer = _StagedFile(target)
        executor = ThreadPoolExecutor(1, thread_name_prefix="aiobk-file-put")
        loop = asyncio.get_running_loop()
        running: list[asyncio.Future[Any]] = []  # the step in the thread, if any

        async def step(operation: str, function: Callable[[], T]) -> T:
            future = loop.run_in_executor(executor, function)
            running[:] = [future]
            return await call(self._url, f"put {key}: {operation}", self._timeout, future)

        try:
            await step("create", writer.create)
            await self._write_all(chunks, writer, step)
            await step("sync", writer.publish)
            return writer.size
        except Exception:
            # The staging file goes: at once unless a step is stuck (the thread runs in order).
            if all(future.done() for future in running):
                with contextlib.suppress(Exception):
                    await step("abort", writer.discard)
            else:
                executor.submit(writer.discard)
            raise
        except BaseException:
            executor.submit(writer.close)  # a kill's stand-in: the staging file stays
            raise
        finally:
            executor.shutdown(wait=False)

    @staticmethod
    async def _write_all(
        chunks: AsyncIterable[bytes | bytearray],
        writer: _StagedFile,
        step: Callable[[str, Callable[[], None]], Awaitable[None]],
    ) -> None:
        """Write ``chunks`` in batches of about ``WRITE_BATCH`` bytes, each in the thread while
        the next one gathers: at most two batches in memory."""
        writing: asyncio.Future[None] | None = None
        batch: list[bytes | bytearray] = []
        batched = 0
        try:
            async for chunk in chunks:
                batch.append(chunk)
                batched += len(chunk)
                if batched >= WRITE_BATCH:
                    if writing is not None:
                        await writing
                    pending, batch, batched = batch, [], 0
                    writing = asyncio.ensure_future(
                        step("write", functools.partial(writer.write, pending))
                    )
            if writing is not None:
                await writing
        except BaseException:
            if writing is not None and not writing.done():
                writing.cancel()  # the thread still ends that write before any later step
                writing.add_done_callback(_retrieved)
            raise
        await step("write", functools.partial(writer.write, batch))

    async def keys(self, prefix: str) -> AsyncIterator[str]:
        start = parent(prefix)
        if start is not None and not (self._root / start).is_dir():
            return  # LocalStore answers an error for a directory that is not there
        async for key in self._listed(prefix, start):
            yield key

    async def uploads(self, prefix: str) -> list[Upload]:
        return await call(
            self._url,
            f"list uploads {prefix}",
            self._timeout,
            asyncio.to_thread(_staging_files, self._root, prefix),
        )

    async def abort(self, upload: Upload) -> None:
        check_key(self._url, upload.key)
        suffix = upload.upload_id.removeprefix(upload.key)
        if suffix == upload.upload_id or not STAGING_SUFFIX.fullmatch(suffix):
            raise ValueError(
                f"{self._url}: {upload.upload_id!r} is not an upload of {upload.key!r}"
            )
        staging = self._root / upload.upload_id
        await call(
            self._url,
            f"abort {upload.upload_id}",
            self._timeout,
            asyncio.to_thread(staging.unlink, missing_ok=True),
        )


class _StagedFile:
    """One put's staging file, written by one thread in order: created, written, synced and
    renamed over the object, its directory synced."""

    def __init__(self, target: Path) -> None:
        self._target = target
        self._staging: Path | None = None
        self._fd: int | None = None
        self._created: list[Path] = []  # directories made for the object, to sync
        self.size = 0

    def create(self) -> None:
        directory = self._target.parent
        missing = [d for d in (directory, *directory.parents) if not d.exists()]
        directory.mkdir(parents=True, exist_ok=True)
        self._created = missing
        for n in range(1, 1 << 20):
            staging = self._target.with_name(f"{self._target.name}#{n}")
            try:
                self._fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            self._staging = staging
            return
        raise ObjectStoreError(f"{self._target}: no free staging name")

    def write(self, chunks: list[bytes | bytearray]) -> None:
        assert self._fd is not None
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            self.size += len(chunk)

    def publish(self) -> None:
        assert self._fd is not None
        assert self._staging is not None
        os.fsync(self._fd)
        self.close()
        os.replace(self._staging, self._target)
        self._staging = None
        # The object's directory names it; each directory made for it is named in its parent.
        for directory in sorted({self._target.parent, *(d.parent for d in self._created)}):
            _sync_directory(directory)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def discard(self) -> None:
        self.close()
        if self._staging is not None:
            self._staging.unlink(missing_ok=True)
            self._staging = None


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _staging_files(root: Path, prefix: str) -> list[Upload]:
    """The staging files under ``root`` whose object's key starts with ``prefix``."""
    start = parent(prefix)
    top = root / start if start else root
    found: list[Upload] = []
    for directory, _, files in os.walk(top):
        for name in files:
            match = STAGING_SUFFIX.search(name)
            if match is None:
                continue
            staging = (Path(directory) / name).relative_to(root).as_posix()
            key = staging[: -len(match[0])]
            if key.startswith(prefix):
                found.append(Upload(key, staging))
    return sorted(found, key=lambda upload: upload.upload_id)


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a cancelled write's outcome seen: the put's own failure is the one raised."""
    if not future.cancelled():
        future.exception()


__all__ = ["DirectoryStore"]
