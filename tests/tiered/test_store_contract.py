"""The object-store contract (tiered/store.py), held by every backend alike: the store in
memory, a directory store on a real directory and an S3 store on moto.

A put cut short by a ``BaseException`` that is not an ``Exception`` stands in for a killed
process: it leaves no object, and an upload that ``uploads`` lists and ``abort`` removes. A
store that stops answering raises ``ObjectStoreError`` within its timeout.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from aiobk.protocol.errors import NoSuchObjectError, ObjectStoreError
from aiobk.tiered import MemoryObjectStore, ObjectStore, Upload, open_object_store
from aiobk.tiered.s3 import PART_SIZE
from tests.support.s3server import ENVIRON

MIB = 1024 * 1024
KEY = "ledgers/0000000000000000007/0f3a.aobk"


class _Killed(BaseException):
    """A stand-in for the process being killed mid-put."""


def _pattern(size: int, seed: int = 0) -> bytes:
    block = bytes((i * 31 + seed) % 251 for i in range(4096))
    return (block * (size // len(block) + 1))[:size]


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]
        await asyncio.sleep(0)


async def _keys(store: ObjectStore, prefix: str) -> list[str]:
    return sorted([key async for key in store.keys(prefix)])


def test_a_memory_store_is_an_object_store() -> None:
    store: ObjectStore = MemoryObjectStore()  # mypy checks the protocol here
    assert store.url == "memory://store"


async def test_put_then_read_back_whole_and_in_ranges(object_store: ObjectStore) -> None:
    data = _pattern(3 * PART_SIZE // 2 + 12_345)  # more than one part on S3
    assert await object_store.put(KEY, _chunks(data, 3 * MIB + 7)) == len(data)
    assert await object_store.size(KEY) == len(data)
    assert await object_store.get_range(KEY, 0, len(data)) == data
    assert await object_store.get_range(KEY, 5 * MIB - 3, 10) == data[5 * MIB - 3 : 5 * MIB + 7]
    assert await object_store.get_range(KEY, len(data), 0) == b""
    ranges = [(len(data) - 64, 64), (0, 16), (100, 0), (MIB, 4096), (MIB + 4096, 4096)]
    assert await object_store.get_ranges(KEY, ranges) == [
        data[start : start + length] for start, length in ranges
    ]
    assert await _keys(object_store, "") == [KEY]
    assert await object_store.uploads("") == []


async def test_small_and_empty_objects_and_a_put_replacing_one(object_store: ObjectStore) -> None:
    assert await object_store.put("a/empty", _chunks(b"", 1)) == 0
    assert await object_store.size("a/empty") == 0
    assert await object_store.get_range("a/empty", 0, 0) == b""
    assert await object_store.put("a/small", _chunks(b"first", 2)) == 5
    assert await object_store.put("a/small", _chunks(b"second!", 3)) == 7
    assert await object_store.get_range("a/small", 0, 7) == b"second!"
    assert await _keys(object_store, "a/") == ["a/empty", "a/small"]


async def test_a_range_past_the_end_is_refused(object_store: ObjectStore) -> None:
    await object_store.put(KEY, _chunks(b"0123456789", 4))
    for start, length in [(8, 3), (10, 1), (11, 0), (50, 5), (-1, 2), (0, -1)]:
        with pytest.raises(ObjectStoreError) as refused:
            await object_store.get_range(KEY, start, length)
        assert not isinstance(refused.value, NoSuchObjectError)
        assert "\n" not in str(refused.value)
    with pytest.raises(ObjectStoreError):
        await object_store.get_ranges(KEY, [(0, 2), (9, 2)])


async def test_a_missing_object(object_store: ObjectStore) -> None:
    assert await object_store.size(KEY) is None
    with pytest.raises(NoSuchObjectError) as missing:
        await object_store.get_range(KEY, 0, 1)
    assert "\n" not in str(missing.value)
    with pytest.raises(NoSuchObjectError):
        await object_store.get_ranges(KEY, [(0, 1), (4, 0)])
    with pytest.raises(NoSuchObjectError):
        await object_store.get_range(KEY, 0, 0)


async def test_delete_is_idempotent(object_store: ObjectStore) -> None:
    await object_store.put(KEY, _chunks(b"data", 4))
    await object_store.delete(KEY)
    await object_store.delete(KEY)
    await object_store.delete("never/there")
    assert await object_store.size(KEY) is None
    assert await _keys(object_store, "") == []


async def test_keys_lists_exactly_the_keys_that_start_with_the_prefix(
    object_store: ObjectStore,
) -> None:
    names = [
        "ledgers/0000000000000000001/a.aobk",
        "ledgers/0000000000000000010/b.aobk",
        "ledgers/0000000000000000010/c.aobk",
        "ledgers/0000000000000000002/d.aobk",
        "ledgersx/e",
        "other/f",
    ]
    for name in names:
        await object_store.put(name, _chunks(name.encode(), 5))
    assert await _keys(object_store, "") == sorted(names)
    assert await _keys(object_store, "ledgers/") == sorted(names[:4])
    assert await _keys(object_store, "ledgers") == sorted(names[:5])
    assert await _keys(object_store, "ledgers/000000000000000001") == names[1:3]
    assert await _keys(object_store, "ledgers/0000000000000000010/") == names[1:3]
    assert await _keys(object_store, "ledgers/0000000000000000010/c") == [names[2]]
    assert await _keys(object_store, "ledgers/0000000000000000003/") == []
    assert await _keys(object_store, "nowhere/at/all/") == []


async def _killed_after(
    data: bytes, size: int, chunks: int, kill: BaseException
) -> AsyncIterator[bytes]:
    sent = 0
    async for chunk in _chunks(data, size):
        if sent == chunks:
            raise kill
        sent += 1
        yield chunk


async def test_a_killed_put_leaves_no_object_and_an_upload_to_abort(
    object_store: ObjectStore,
) -> None:
    await object_store.put("ledgers/0000000000000000008/done.aobk", _chunks(b"whole", 2))
    data = _pattern(4 * PART_SIZE)
    with pytest.raises(_Killed):
        await object_store.put(KEY, _killed_after(data, 3 * MIB, 3, _Killed()))
    assert await object_store.size(KEY) is None
    with pytest.raises(NoSuchObjectError):
        await object_store.get_range(KEY, 0, 1)
    assert await _keys(object_store, "ledgers/") == ["ledgers/0000000000000000008/done.aobk"]

    (upload,) = await object_store.uploads("ledgers/")
    assert upload.key == KEY
    assert await object_store.uploads("ledgers/0000000000000000007/") == [upload]
    assert await object_store.uploads("ledgers/0000000000000000008/") == []
    assert await object_store.uploads("other/") == []
    await object_store.abort(upload)
    assert await object_store.uploads("") == []
    await object_store.abort(upload)  # already gone: not an error
    assert await _keys(object_store, "") == ["ledgers/0000000000000000008/done.aobk"]


async def test_a_put_whose_chunks_fail_aborts_its_upload(object_store: ObjectStore) -> None:
    data = _pattern(2 * PART_SIZE)
    with pytest.raises(RuntimeError, match="source failed"):
        await object_store.put(KEY, _killed_after(data, 3 * MIB, 2, RuntimeError("source failed")))
    assert await object_store.size(KEY) is None
    assert await object_store.uploads("") == []
    assert await _keys(object_store, "") == []


async def test_a_slow_source_is_not_a_stalled_store(tmp_path: Path) -> None:
    """The timeout bounds the store's part of a put, not the time its caller takes."""
    store = open_object_store(f"file://{tmp_path}", timeout=0.2)

    async def slow() -> AsyncIterator[bytes]:
        for _ in range(4):
            await asyncio.sleep(0.1)  # a slow source on purpose: each chunk takes its time
            yield b"x" * 1000

    assert await store.put("slow", slow()) == 4000
    await store.close()


# -- a store that stops answering


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


async def _is_bounded(operation: object, timeout: float) -> str:
    started = time.monotonic()
    with pytest.raises(ObjectStoreError) as stalled:
        await operation  # type: ignore[misc]
    assert time.monotonic() - started < timeout + 2.0
    assert not isinstance(stalled.value, NoSuchObjectError)
    message = str(stalled.value)
    assert "\n" not in message
    return message


async def test_a_stalled_s3_store_raises_within_its_timeout(silent_port: int) -> None:
    url = f"s3://bucket/p?endpoint=http://127.0.0.1:{silent_port}&region=us-east-1"
    store = open_object_store(url, timeout=0.5, environ=ENVIRON)
    message = await _is_bounded(store.get_range(KEY, 0, 10), 0.5)
    assert message.startswith(f"{store.url}: get {KEY}")
    assert "0.5 s" in message
    await _is_bounded(store.size(KEY), 0.5)
    await _is_bounded(store.delete(KEY), 0.5)
    await _is_bounded(_keys(store, "ledgers/"), 0.5)
    await _is_bounded(store.put(KEY, _chunks(b"data", 2)), 0.5)
    await _is_bounded(store.put(KEY, _chunks(_pattern(PART_SIZE + 1), MIB)), 0.5)
    await _is_bounded(store.uploads(""), 0.5)
    await _is_bounded(store.abort(Upload(KEY, "id")), 0.5)
    await store.close()


async def test_a_stalled_directory_raises_within_its_timeout(tmp_path: Path) -> None:
    """A FIFO with no writer stands in for a file system that stops answering: opening it
    blocks."""
    store = open_object_store(f"file://{tmp_path}", timeout=0.5)
    os.mkfifo(tmp_path / "stuck")
    try:
        message = await _is_bounded(store.get_range("stuck", 0, 10), 0.5)
        assert message.startswith(f"file://{tmp_path}: get stuck")
    finally:  # let the blocked open through, so that no thread stays stuck
        os.close(os.open(tmp_path / "stuck", os.O_WRONLY | os.O_NONBLOCK))
    await store.close()


async def test_a_write_that_fails_while_the_next_batch_gathers_fails_the_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory store writes a batch in its thread while the next one gathers: a write
    that fails there (a full disk) fails the put, and no object or staging file is left."""
    from aiobk.tiered import file as file_store

    written: list[int] = []
    write = file_store._StagedFile.write

    def full_at_the_second(self: file_store._StagedFile, chunks: list[bytes]) -> None:
        written.append(sum(map(len, chunks)))
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        write(self, chunks)

    monkeypatch.setattr(file_store._StagedFile, "write", full_at_the_second)
    store = open_object_store(f"file://{tmp_path}")
    with pytest.raises(ObjectStoreError, match="No space left"):
        await store.put(KEY, _chunks(_pattern(5 * MIB), MIB // 2))
    assert len(written) >= 2
    assert await store.size(KEY) is None
    assert await store.uploads("") == []
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    await store.close()
