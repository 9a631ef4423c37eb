"""Length-prefixed frames: a 4-byte big-endian length, then that many bytes of msgpack.

``FrameDecoder`` is fed whatever the socket produced and hands back whole frames. A length over
the configured maximum is a ``FrameTooLargeError`` raised before any allocation for it: the
stream cannot be resynchronised after that, so the connection must be closed.
"""

from __future__ import annotations

import struct

LENGTH = struct.Struct(">I")
DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024  # BookKeeper's nettyMaxFrameSizeBytes default
LARGE_FRAME = 64 * 1024  # frames this long are gathered read by read, and copied once


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

    Bytes that do not make a whole frame yet are kept in one buffer, except the bytes of a
    large frame (``LARGE_FRAME`` or more: a 1 MiB range read's answer arrives in several
    reads): those are held as the reads brought them and copied once, when the frame is whole,
    where appending them to the buffer and cutting the frame out again copied them two or
    three times."""

    __slots__ = ("_buf", "_held", "_need", "_parts", "_pos", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 1:
            raise ValueError("max_frame_size must be positive")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        # A large frame being gathered: its bytes so far (length prefix first), their count,
        # and the count that makes it whole.
        self._parts: list[bytes | bytearray | memoryview] = []
        self._held = 0
        self._need = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add bytes; return every frame now complete, in order."""
        if self._parts:
            return self._gather(data if type(data) is bytes else bytes(data))
        if not self._buf and type(data) is bytes:
            return self._feed_bytes(data)
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = self._pos
        end = len(buf)
        limit = self.max_frame_size
        with memoryview(buf) as view:  # one copy a frame (a bytearray slice would be a second)
            while end - pos >= 4:
                (size,) = LENGTH.unpack_from(buf, pos)
                if size > limit:
                    raise FrameTooLargeError(size, limit)
                if end - pos - 4 < size:
                    if size >= LARGE_FRAME:  # gathered from here on (``_gather``)
                        self._parts.append(bytes(view[pos:end]))
                        self._held, self._need = end - pos, 4 + size
                        pos = end
                    break
                out.append(bytes(view[pos + 4 : pos + 4 + size]))
                pos += 4 + size
        if pos == end:
            buf.clear()
            pos = 0
        elif pos > 65536 and pos * 2 > end:
            del buf[:pos]
            pos = 0
        self._pos = pos
        return out

    def _feed_bytes(self, data: bytes) -> list[bytes]:
        """``feed`` with nothing buffered (most reads): frames are sliced out of ``data``
        itself, and only an incomplete tail is kept. A loop of its own: one shared with
        ``feed`` through a memoryview cost more than the old double copy (1.1 against 0.6 us a
        1 KiB frame, 1.0 against 0.5 for a small one)."""
        out: list[bytes] = []
        pos = 0
        end = len(data)
        limit = self.max_frame_size
        while end - pos >= 4:
            (size,) = LENGTH.unpack_from(data, pos)
            if size > limit:
                raise FrameTooLargeError(size, limit)
            if end - pos - 4 < size:
                if size >= LARGE_FRAME:  # gathered from here on (``_gather``)
                    self._parts.append(memoryview(data)[pos:] if pos else data)
                    self._held, self._need = end - pos, 4 + size
                    return out
                break
            out.append(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos < end:
            with memoryview(data) as view:
                self._buf += view[pos:]
        return out

    def _gather(self, data: bytes) -> list[bytes]:
        """A read while a large frame is gathered: held as it came (short reads joined into
        one part, so a peer that trickles costs no object per read), until the frame is whole;
        then the frame is copied once, and the rest of the read is read as a fresh one."""
        parts = self._parts
        missing = self._need - self._held
        if len(data) < missing:
            if len(data) < LARGE_FRAME and type(parts[-1]) is bytearray:
                parts[-1] += data
            else:
                parts.append(data if len(data) >= LARGE_FRAME else bytearray(data))
            self._held += len(data)
            return []
        views = [memoryview(part) for part in parts]
        views[0] = views[0][LENGTH.size :]
        with memoryview(data) as tail:
            frame_bytes = b"".join([*views, tail[:missing]])
        for view in views:
            view.release()
        self._parts, self._held, self._need = [], 0, 0
        if missing == len(data):
            return [frame_bytes]
        return [frame_bytes, *self.feed(data[missing:])]

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buf) - self._pos + self._held
