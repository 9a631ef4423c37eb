"""Encoding messages to frames and decoding frames to validated messages.

Decoding never trusts its input: any frame that is not exactly one msgpack array of the right
shape and types raises ``MalformedMessageError`` carrying the ``txn_id`` when one could be read,
so that a server can answer EBADREQ to that request and keep the connection.
"""

from __future__ import annotations

from typing import Any

import msgpack

from aiobk.protocol.framing import DEFAULT_MAX_FRAME_SIZE, LENGTH
from aiobk.protocol.messages import (
    INT64_MAX,
    INT64_MIN,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    MalformedMessageError,
    Message,
    Request,
    Response,
)

_MAX_ARRAY = 32
_MAX_MAP = 256

_packer = msgpack.Packer(use_bin_type=True, autoreset=True)


def encode(message: Message) -> bytes:
    """One message as a complete frame (length prefix included)."""
    payload = _packer.pack(message.to_wire())
    return LENGTH.pack(len(payload)) + payload


_BIN8, _BIN16, _BIN32 = b"\xc4", b"\xc5", b"\xc6"


def encode_parts(message: Message) -> tuple[bytes, bytes]:
    """``encode(message)`` as two buffers, for a message whose last field is a large
    ``bytes`` (an ADD_BATCH's bodies): the frame's head, then that field itself, uncopied.
    ``b"".join(encode_parts(m)) == encode(m)``; a connection writes both with one
    ``writelines``, so a batch is not copied into a frame (twice: msgpack's buffer, then the
    length prefix's concatenation)."""
    fields = message.to_wire()
    tail = fields.pop()
    if type(tail) is not bytes:
        raise TypeError(f"{type(message).__name__}: the last field is not bytes")
    size = len(tail)
    if size < 0x100:
        bin_head = _BIN8 + size.to_bytes(1, "big")
    elif size < 0x10000:
        bin_head = _BIN16 + size.to_bytes(2, "big")
    else:
        bin_head = _BIN32 + size.to_bytes(4, "big")
    head = _packer.pack_array_header(len(fields) + 1) + b"".join(map(_packer.pack, fields))
    head += bin_head
    return LENGTH.pack(len(head) + size) + head, tail


def _unpack(data: bytes, max_size: int) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_size,
            max_str_len=max_size,
            max_array_len=_MAX_ARRAY,
            max_map_len=_MAX_MAP,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types on garbage; all mean the same here
        raise MalformedMessageError(f"not a msgpack value: {exc}") from None


def _build(types: dict[int, Any], value: Any) -> Any:
    if type(value) is not list or len(value) < 2:
        raise MalformedMessageError("a message is an array [tag, txn_id, ...]")
    tag, txn_id = value[0], value[1]
    if type(txn_id) is not int or not INT64_MIN <= txn_id <= INT64_MAX:
        raise MalformedMessageError("txn_id must be a 64-bit integer")
    if type(tag) is not int:
        raise MalformedMessageError("tag must be an integer", txn_id)
    cls = types.get(tag)
    if cls is None:
        raise MalformedMessageError(f"unknown message tag {tag}", txn_id, tag)
    return cls._decode(value, txn_id, tag)


def decode_request(data: bytes, max_size: int = DEFAULT_MAX_FRAME_SIZE) -> Request:
    """Decode one frame's payload (no length prefix) into a request."""
    message: Request = _build(REQUEST_TYPES, _unpack(data, max_size))
    return message


def decode_response(data: bytes, max_size: int = DEFAULT_MAX_FRAME_SIZE) -> Response:
    """Decode one frame's payload (no length prefix) into a response."""
    message: Response = _build(RESPONSE_TYPES, _unpack(data, max_size))
    return message
