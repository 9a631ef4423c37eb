"""Length-prefixed frames: a 4-byte big-endian length, then that many bytes of msgpack.

``FrameDecoder`` is fed whatever the socket produced and hands back whole frames. A length over
the configured maximum is a ``FrameTooLargeError`` raised before any allocation for it: the
stream cannot be resynchronised after that, so the connection must be closed.
"""

from __future__ import annotations

import struct

LENGTH = struct.Struct(">I")
DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024  # BookKeeper's nettyMaxFrameSizeBytes default
SMALL_READ = 64 * 1024  # reads shorter than this are gathered into one part while a frame waits


class FrameError(ValueError):
    """The byte stream is broken; the connection cannot continue."""


class FrameTooLargeError(FrameError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its length."""
    return LENGTH.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental frame splitter. Not thread-safe; one per connection.

    Bytes that do not make a whole frame yet are held as the reads brought them, not appended
    to one growing buffer, so a large frame (a 1 MiB range read's answer arrives in several
    reads) is copied once, when it is whole. Small reads are gathered into one ``bytearray``
    part, so a peer that trickles a frame a byte at a time costs no object per byte."""

    __slots__ = ("_held", "_parts", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 1:
            raise ValueError("max_frame_size must be positive")
        self.max_frame_size = max_frame_size
        self._parts: list[bytes | bytearray | memoryview] = []
        self._held = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add bytes; return every frame now complete, in order."""
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse its buffer
        parts = self._parts
        if not parts:
            return self._feed_bytes(data)
        held = self._held
        if held < LENGTH.size or len(parts[0]) < LENGTH.size:  # the length arrived in pieces
            self._parts, self._held = [], 0
            return self._feed_bytes(b"".join([*parts, data]))
        (size,) = LENGTH.unpack_from(parts[0])  # checked against the limit when it came
        need = LENGTH.size + size - held  # the frame's bytes still to come
        if need > len(data):
            if len(data) < SMALL_READ and type(parts[-1]) is bytearray:
                parts[-1] += data  # a bytearray, just checked
            else:
                parts.append(data if len(data) >= SMALL_READ else bytearray(data))
            self._held = held + len(data)
            return []
        # The frame is whole: one copy of it, then the rest of ``data`` as a fresh read.
        self._parts, self._held = [], 0
        views = [memoryview(part) for part in parts]
        views[0] = views[0][LENGTH.size :]
        with memoryview(data) as tail:
            frame_bytes = b"".join([*views, tail[:need]])
        for view in views:
            view.release()
        if need == len(data):
            return [frame_bytes]
        return [frame_bytes, *self._feed_bytes(data[need:])]

    def _feed_bytes(self, data: bytes) -> list[bytes]:
        """``feed`` with nothing held (most reads): frames are sliced out of ``data`` itself,
        and only an incomplete tail is kept."""
        out: list[bytes] = []
        pos = 0
        end = len(data)
        limit = self.max_frame_size
        while end - pos >= 4:
            (size,) = LENGTH.unpack_from(data, pos)
            if size > limit:
                raise FrameTooLargeError(size, limit)
            if end - pos - 4 < size:
                break
            out.append(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos < end:
            self._parts.append(data[pos:] if end - pos < SMALL_READ else memoryview(data)[pos:])
            self._held = end - pos
        return out

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return self._held
