"""Hostile peers get EBADREQ or a closed connection; everyone else is served undisturbed."""

from __future__ import annotations

import asyncio
import random
import struct

import msgpack

from aiobk.protocol import (
    AddRequest,
    ErrorResponse,
    FrameDecoder,
    StatusCode,
    decode_response,
    encode,
)
from tests.bookie.helpers import KEY, add, add_request, read

LENGTH = struct.Struct(">I")


async def _raw(bookie, payload: bytes, expect_reply: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection(*bookie.address)
    writer.write(payload)
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(65536), 5) if expect_reply else b""
    finally:
        writer.close()
    return data


async def test_bad_requests_get_ebadreq_and_the_connection_lives(start_bookie) -> None:
    bookie = await start_bookie()
    reader, writer = await asyncio.open_connection(*bookie.address)
    frames = [
        msgpack.packb([2, 41, "not", "an", "add"]),  # wrong field types
        msgpack.packb([99, 42]),  # unknown op with a txn_id
        msgpack.packb([2, 43, 1, 0, 0, 7, b"", b""]),  # unknown durability
    ]
    writer.write(b"".join(LENGTH.pack(len(f)) + f for f in frames))
    # A good request after the bad ones, on the same connection.
    good = AddRequest(44, 1, 0, master_key=KEY, body=b"\x00")  # body too short: EBADREQ too
    writer.write(encode(good))
    await writer.drain()
    decoder = FrameDecoder()
    responses = []
    while len(responses) < 4:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, "bookie closed a connection that only sent parseable requests"
        responses.extend(decode_response(f) for f in decoder.feed(data))
    writer.close()
    by_txn = {r.txn_id: r for r in responses}
    assert set(by_txn) == {41, 42, 43, 44}
    for txn in (41, 42, 43):
        assert isinstance(by_txn[txn], ErrorResponse)
        assert by_txn[txn].status is StatusCode.EBADREQ
    assert by_txn[42].request_op == 99
    assert by_txn[44].status is StatusCode.EBADREQ


async def test_unparseable_and_oversized_frames_close_only_that_peer(start_bookie) -> None:
    bookie = await start_bookie(max_frame_size=64 * 1024)
    # Oversized length prefix: closed without reading a byte more.
    assert await _raw(bookie, LENGTH.pack(2**31) + b"xxxx") == b""
    # Not msgpack at all, and msgpack that is not a message: closed.
    assert await _raw(bookie, LENGTH.pack(3) + b"\xc1\xc1\xc1") == b""
    assert await _raw(bookie, LENGTH.pack(1) + b"\x01") == b""
    assert bookie.stats.bad_requests >= 3
    assert bookie.running


async def test_garbage_storm_does_not_disturb_a_well_behaved_writer(start_bookie, connect) -> None:
    bookie = await start_bookie(max_frame_size=256 * 1024)
    conn = await connect(bookie)
    rng = random.Random(1234)
    errors: list[object] = []
    stop = asyncio.Event()

    async def well_behaved() -> int:
        entry = 0
        while not stop.is_set() and entry < 5000:
            batch = [
                conn.send(add_request(conn, 77, entry + i, b"v%d" % (entry + i)), 10)
                for i in range(20)
            ]
            for response in await asyncio.gather(*batch):
                if response.status is not StatusCode.EOK:
                    errors.append(response)
            entry += 20
        return entry

    async def attacker(seed: int) -> None:
        local = random.Random(seed)
        for _ in range(40):
            kind = local.randrange(5)
            if kind == 0:
                payload = local.randbytes(local.randrange(1, 300))
            elif kind == 1:
                frame = encode(AddRequest(1, 77, 0, master_key=KEY, body=b"x" * 50))
                payload = frame[: local.randrange(1, len(frame))]  # truncated, then hang up
            elif kind == 2:
                payload = LENGTH.pack(local.randrange(2**20, 2**32)) + b"junk"
            elif kind == 3:
                junk = msgpack.packb([local.randrange(256), local.randrange(2**31), b"?"])
                payload = LENGTH.pack(len(junk)) + junk
            else:
                inner = local.randbytes(local.randrange(0, 64))
                payload = LENGTH.pack(len(inner)) + inner
            reader, writer = await asyncio.open_connection(*bookie.address)
            try:
                writer.write(payload)
                await writer.drain()
                await asyncio.wait_for(reader.read(1024), 0.2)
            except (TimeoutError, OSError):
                pass
            finally:
                writer.close()

    writer_task = asyncio.ensure_future(well_behaved())
    await asyncio.gather(*(attacker(rng.randrange(2**32)) for _ in range(4)))
    stop.set()
    written = await asyncio.wait_for(writer_task, 60)
    assert errors == []
    assert written >= 20
    # The bookie still serves, and what was written reads back.
    assert (await read(conn, 77, written - 1)).status is StatusCode.EOK
    assert (await add(conn, 77, written, b"after the storm")).status is StatusCode.EOK
    assert bookie.stats.bad_requests > 0
