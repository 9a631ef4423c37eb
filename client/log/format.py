"""How a log's records are stored in its ledgers' entries: raw, or in the record envelope.

A log says its format in its metadata record (``LogMetadata.record_format``), fixed when the log
is created. Logs created before formats existed, and logs created with ``"raw"``, hold each
record's bytes as the entry's payload, nothing more. A log created with ``"envelope"`` holds
each record in this envelope (all integers big-endian), part of the storage contract as the
entry format is:

====================  =====================================================================
bytes                 field
====================  =====================================================================
1                     ``0xE1``: envelope version 1 (``0xE2``: version 2, below; any other
                      first byte: not an envelope)
8                     timestamp, signed milliseconds since the Unix epoch
4                     key length, signed; -1: no key (an empty key is 0)
key length            key
2                     header count
per header: 2         name length, then the name in UTF-8
per header: 4         value length, then the value
the rest              the record's data
====================  =====================================================================

Header names are unique (a map, as Spark's ``map<string,binary>`` column reads them). The data
is the entry's tail, so an envelope costs 15 bytes plus its key and headers. The codec is pure:
no clock here, the writer stamps the time.

A record appended by a producer (an idempotent writer, docs/design/logs.md) is in envelope
version 2: first byte ``0xE2``, the fields above up to the headers, then

====================  =====================================================================
1                     producer id length (1 to 255)
producer id length    the producer id, UTF-8
8                     the record's sequence number, signed, at least 0
the rest              the record's data
====================  =====================================================================

Version 1 stays what every record without a producer is written in, so logs written before
producers existed read unchanged, and a plain append costs nothing more.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

RAW: Final = "raw"
ENVELOPE: Final = "envelope"
FORMATS: Final = (RAW, ENVELOPE)

VERSION_1: Final = 0xE1
VERSION_2: Final = 0xE2  # version 1 and a producer id and sequence before the data
_HEAD = struct.Struct(">BqiH")  # the smallest envelope: version, timestamp, key length, count
_KEY = struct.Struct(">Bqi")
_COUNT = struct.Struct(">H")
_NAME = struct.Struct(">H")
_VALUE = struct.Struct(">I")
_PRODUCER = struct.Struct(">B")
_SEQUENCE = struct.Struct(">q")
MAX_PRODUCER_ID: Final = 0xFF  # bytes of UTF-8
_EMPTY: Final[Mapping[str, bytes]] = {}
MAX_HEADERS: Final = 0xFFFF
MAX_NAME: Final = 0xFFFF
MIN_TIMESTAMP: Final = -(2**63)
MAX_TIMESTAMP: Final = 2**63 - 1


class RecordFormatError(ValueError):
    """An entry that is not a well-formed record envelope, or a record that cannot be put in
    one (a header name too long, a timestamp out of range)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """A record as the envelope holds it."""

    data: bytes
    timestamp: int
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=dict)
    producer_id: str | None = None  # version 2: the producer that appended it
    sequence: int | None = None  # ... and its sequence number there


def check_producer_id(producer_id: str) -> bytes:
    """The UTF-8 of a producer id; ValueError when it is empty or longer than 255 bytes."""
    encoded = producer_id.encode()
    if not encoded or len(encoded) > MAX_PRODUCER_ID:
        raise ValueError(
            f"producer id {producer_id!r}: 1 to {MAX_PRODUCER_ID} bytes of UTF-8, "
            f"not {len(encoded)}"
        )
    return encoded


class ProducerStamp:
    """The envelope of a producer's records without key or headers, the common case, packed in
    one call: the producer's part of the header is fixed, so one ``struct`` holds all of it."""

    __slots__ = ("_head", "_producer")

    def __init__(self, producer: bytes) -> None:
        self._producer = producer  # checked and encoded (check_producer_id)
        self._head = struct.Struct(f">BqiHB{len(producer)}sq")

    def encode(self, data: bytes, timestamp: int, sequence: int) -> bytes:
        """What ``encode(data, timestamp, None, None, producer, sequence)`` returns."""
        producer = self._producer
        if sequence < 0:
            return encode(data, timestamp, None, None, producer, sequence)  # raises its error
        try:
            head = self._head.pack(VERSION_2, timestamp, -1, 0, len(producer), producer, sequence)
        except struct.error:  # a timestamp or sequence past 64 bits: encode names which
            return encode(data, timestamp, None, None, producer, sequence)
        return b"".join((head, data))


def check_format(name: str) -> str:
    """``name`` if it is a record format, else ValueError naming the formats."""
    if name not in FORMATS:
        raise ValueError(f"unknown log record format {name!r}: one of {', '.join(FORMATS)}")
    return name


def encode(
    data: bytes,
    timestamp: int,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | None = None,
    producer: bytes | None = None,
    sequence: int = 0,
) -> bytes:
    """The envelope of one record; with ``producer`` (a checked, encoded producer id) and its
    ``sequence``, in version 2."""
    if not MIN_TIMESTAMP <= timestamp <= MAX_TIMESTAMP:
        raise RecordFormatError(f"timestamp {timestamp} does not fit in 64 bits")
    headers = headers or _EMPTY
    tail: tuple[bytes, ...] = (data,)
    version = VERSION_1
    if producer is not None:
        if not 0 <= sequence <= MAX_TIMESTAMP:
            raise RecordFormatError(f"sequence {sequence}: from 0 to {MAX_TIMESTAMP}")
        version = VERSION_2
        tail = (_PRODUCER.pack(len(producer)), producer, _SEQUENCE.pack(sequence), data)
    if not headers:
        if key is None:
            return b"".join((_KEY.pack(version, timestamp, -1), b"\0\0", *tail))
        return b"".join((_KEY.pack(version, timestamp, len(key)), key, b"\0\0", *tail))
    if len(headers) > MAX_HEADERS:
        raise RecordFormatError(f"{len(headers)} headers: at most {MAX_HEADERS}")
    parts = [_KEY.pack(version, timestamp, -1 if key is None else len(key))]
    if key is not None:
        parts.append(key)
    parts.append(_COUNT.pack(len(headers)))
    for name, value in headers.items():
        encoded = name.encode()
        if len(encoded) > MAX_NAME:
            raise RecordFormatError(f"header name of {len(encoded)} bytes: at most {MAX_NAME}")
        parts += (_NAME.pack(len(encoded)), encoded, _VALUE.pack(len(value)), value)
    parts += tail
    return b"".join(parts)


def decode(body: bytes) -> Envelope:
    """The record in ``body``; RecordFormatError naming what is wrong when it is not an
    envelope (truncated, a bad version, lengths past the end, a name that is not UTF-8)."""
    size = len(body)
    if size < _HEAD.size:
        raise RecordFormatError(f"{size} bytes: shorter than an envelope's {_HEAD.size}")
    version, timestamp, key_length = _KEY.unpack_from(body)
    if version not in (VERSION_1, VERSION_2):
        raise RecordFormatError(
            f"envelope version byte {version:#04x}, not {VERSION_1:#04x} or {VERSION_2:#04x}"
        )
    offset = _KEY.size
    key: bytes | None = None
    if key_length >= 0:
        if offset + key_length + _COUNT.size > size:
            raise RecordFormatError(f"key of {key_length} bytes runs past the record's end")
        key = body[offset : offset + key_length]
        offset += key_length
    elif key_length != -1:
        raise RecordFormatError(f"key length {key_length}")
    (count,) = _COUNT.unpack_from(body, offset)
    offset += _COUNT.size
    if not count and version == VERSION_1:
        return Envelope(body[offset:], timestamp, key, _EMPTY)
    headers: dict[str, bytes] = {}
    try:
        for _ in range(count):
            (length,) = _NAME.unpack_from(body, offset)
            offset += _NAME.size
            if offset + length > size:
                raise RecordFormatError("a header name runs past the record's end")
            name = body[offset : offset + length].decode()
            offset += length
            (length,) = _VALUE.unpack_from(body, offset)
            offset += _VALUE.size
            if offset + length > size:
                raise RecordFormatError("a header value runs past the record's end")
            headers[name] = body[offset : offset + length]
            offset += length
    except struct.error:
        raise RecordFormatError("a header runs past the record's end") from None
    except UnicodeDecodeError:
        raise RecordFormatError("a header name is not UTF-8") from None
    if len(headers) != count:
        raise RecordFormatError("a header name appears twice")
    if version == VERSION_1:
        return Envelope(body[offset:], timestamp, key, headers)
    return _decode_producer(body, offset, timestamp, key, headers or _EMPTY)


def _decode_producer(
    body: bytes, offset: int, timestamp: int, key: bytes | None, headers: Mapping[str, bytes]
) -> Envelope:
    size = len(body)
    if offset + _PRODUCER.size > size:
        raise RecordFormatError("the producer id runs past the record's end")
    (length,) = _PRODUCER.unpack_from(body, offset)
    offset += _PRODUCER.size
    if not length or offset + length + _SEQUENCE.size > size:
        raise RecordFormatError(f"producer id of {length} bytes in a record of {size}")
    try:
        producer = body[offset : offset + length].decode()
    except UnicodeDecodeError:
        raise RecordFormatError("the producer id is not UTF-8") from None
    offset += length
    (sequence,) = _SEQUENCE.unpack_from(body, offset)
    if sequence < 0:
        raise RecordFormatError(f"sequence {sequence}")
    offset += _SEQUENCE.size
    return Envelope(body[offset:], timestamp, key, headers, producer, sequence)


def timestamp_of(body: bytes) -> int:
    """Only the timestamp of an envelope (the time search reads nothing else)."""
    if len(body) < _HEAD.size or body[0] not in (VERSION_1, VERSION_2):
        raise RecordFormatError("not a record envelope")
    return int(_KEY.unpack_from(body)[1])


__all__ = [
    "ENVELOPE",
    "FORMATS",
    "RAW",
    "Envelope",
    "ProducerStamp",
    "RecordFormatError",
    "check_format",
    "check_producer_id",
    "decode",
    "encode",
    "timestamp_of",
]
