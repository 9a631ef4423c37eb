"""A journal or log file wrapper for tests: every call goes to the real file unless overridden."""

from __future__ import annotations

from aiobk.bookie.disk import AppendFile


class DelegatingAppendFile:
    """An ``AppendFile`` handing each call to ``inner``; a test's wrapper overrides the calls it
    watches, holds or makes fail."""

    def __init__(self, inner: AppendFile) -> None:
        self._inner = inner

    @property
    def size(self) -> int:
        return self._inner.size

    @property
    def room(self) -> int:
        return self._inner.room

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)

    async def write_and_sync(self, data: bytes) -> None:
        await self._inner.write_and_sync(data)

    def write_and_sync_now(self, data: bytes) -> None:
        self._inner.write_and_sync_now(data)

    def write_now(self, data: bytes) -> None:
        self._inner.write_now(data)

    async def sync(self) -> None:
        await self._inner.sync()

    async def rewind(self, size: int) -> None:
        await self._inner.rewind(size)

    async def close(self) -> None:
        await self._inner.close()
