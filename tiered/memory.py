"""An object store in memory: the same contract as the directory and S3 stores, with no I/O.

Tests use it where the store is not what they test, and the simulator's store extends it with
virtual-time latency and failures. A ``put`` whose chunks raise an ``Exception`` aborts its
upload, as the real stores' clients do; one cut short by a ``BaseException`` that is not an
``Exception`` (how the simulator and the crash tests stand in for a killed process) leaves its
``Upload`` behind for ``uploads`` to find.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Sequence

from aiobk.protocol.errors import NoSuchObjectError, ObjectStoreError
from aiobk.tiered.store import Upload


class MemoryObjectStore:
    """Objects in a dict, named by ``url`` (``memory://NAME``)."""

    def __init__(self, url: str = "memory://store") -> None:
        self._url = url
        self.objects: dict[str, bytes] = {}
        self._uploads: dict[str, tuple[str, list[bytes]]] = {}  # upload id: key, parts
        self._next_upload = 0

    @property
    def url(self) -> str:
        return self._url

    async def put(self, key: str, chunks: AsyncIterable[bytes | bytearray]) -> int:
        self._next_upload += 1
        upload_id = f"upload-{self._next_upload}"
        parts: list[bytes] = []
        self._uploads[upload_id] = (key, parts)
        try:
            parts.extend([bytes(chunk) async for chunk in chunks])
        except Exception:
            del self._uploads[upload_id]
            raise
        del self._uploads[upload_id]
        data = b"".join(parts)
        self.objects[key] = data
        return len(data)

    def _object(self, key: str) -> bytes:
        data = self.objects.get(key)
        if data is None:
            raise NoSuchObjectError(f"{self._url}: no object {key!r}")
        return data

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        data = self._object(key)
        if start < 0 or length < 0 or start + length > len(data):
            raise ObjectStoreError(
                f"{self._url}: range {start}+{length} of {key!r} is past its {len(data)} bytes"
            )
        return data[start : start + length]

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [await self.get_range(key, start, length) for start, length in ranges]

    async def size(self, key: str) -> int | None:
        data = self.objects.get(key)
        return None if data is None else len(data)

    async def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    async def keys(self, prefix: str) -> AsyncIterator[str]:
        for key in sorted(self.objects):
            if key.startswith(prefix):
                yield key

    async def uploads(self, prefix: str) -> list[Upload]:
        return [
            Upload(key, upload_id)
            for upload_id, (key, _) in sorted(self._uploads.items())
            if key.startswith(prefix)
        ]

    async def abort(self, upload: Upload) -> None:
        self._uploads.pop(upload.upload_id, None)

    async def close(self) -> None:
        return None


__all__ = ["MemoryObjectStore"]
