"""atheris target: the offload object's parsers (protocol.offload_object).

1. Any ledger (bodies of any length, any block size) encodes, and the object reads back whole
   through ``parse_object`` and entry by entry through ``parse_footer``, ``index_span``,
   ``parse_locations`` and ``check_body``; one byte changed anywhere is refused.
2. Arbitrary bytes through ``parse_header``, ``parse_footer``, ``parse_locations`` and
   ``parse_object``, and arbitrary index blocks under a footer and CRCs that match them:
   refused with ``MalformedObjectError``, never another exception.

    python -m tests.fuzz.offload -runs=200000          # make fuzz
"""

from __future__ import annotations

import contextlib
import struct
import sys

import atheris

with atheris.instrument_imports():
    import crc32c

    from aiobk.protocol.errors import MalformedObjectError
    from aiobk.protocol.offload_object import (
        FOOTER_SIZE,
        HEADER_SIZE,
        ObjectEncoder,
        ObjectHeader,
        check_body,
        index_span,
        parse_footer,
        parse_header,
        parse_index,
        parse_locations,
        parse_object,
    )

FOOTER = struct.Struct(">8sHHIQQqQQI")
INDEX = struct.Struct(">8sqQII")


def _round_trip(fdp: atheris.FuzzedDataProvider) -> None:
    count = fdp.ConsumeIntInRange(0, 12)
    bodies = [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 80)) for _ in range(count)]
    header = ObjectHeader(fdp.ConsumeIntInRange(0, 2**63 - 1), 0, len(bodies) - 1, bytes(16), 1)
    encoder = ObjectEncoder(header, fdp.ConsumeIntInRange(1, 200))
    chunks: list[bytes | bytearray] = []
    for entry_id, body in enumerate(bodies):
        chunks += encoder.add(entry_id, body)
    data = b"".join(chunks + encoder.finish())
    if parse_object(data) != (header, bodies):
        raise AssertionError("an object did not read back what was written")
    footer = parse_footer(data[-FOOTER_SIZE:])
    first = fdp.ConsumeIntInRange(0, len(bodies))
    last = fdp.ConsumeIntInRange(first - 1, len(bodies) - 1)
    start, length = index_span(footer, first, last)
    locations = parse_locations(data[start : start + length], last - first + 1, footer.index_offset)
    for entry_id, where in enumerate(locations, first):
        body = check_body(entry_id, where, data[where.offset : where.offset + where.length])
        if body != bodies[entry_id]:
            raise AssertionError(f"entry {entry_id} did not read back what was written")
    damaged = bytearray(data)
    damaged[fdp.ConsumeIntInRange(0, len(data) - 1)] ^= fdp.ConsumeIntInRange(1, 255)
    try:
        parse_object(bytes(damaged))
    except MalformedObjectError:
        return
    raise AssertionError("a damaged object was read as sound")


def _garbage(fdp: atheris.FuzzedDataProvider) -> None:
    count = fdp.ConsumeIntInRange(0, 8)
    index = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    if fdp.ConsumeBool():  # an index header that agrees with the footer, then any records
        index = INDEX.pack(b"AIOBKIDX", 0, count, fdp.ConsumeIntInRange(0, 4), 0) + index
    data = fdp.ConsumeBytes(fdp.remaining_bytes())
    for call in (
        lambda: parse_header(data[:HEADER_SIZE]),
        lambda: parse_footer(data[-FOOTER_SIZE:]),
        lambda: parse_locations(data, count, len(data)),
        lambda: parse_object(data),
    ):
        with contextlib.suppress(MalformedObjectError):
            call()
    # An index under a footer whose CRCs match, so the checks past the CRCs are reached.
    offset = HEADER_SIZE + len(data)
    body = FOOTER.pack(
        b"AIOBKEND", 1, FOOTER_SIZE, 0, offset, len(index), 7, count,
        offset + len(index) + FOOTER_SIZE, crc32c.crc32c(index),
    )  # fmt: skip
    with contextlib.suppress(MalformedObjectError):
        parse_index(parse_footer(body + struct.pack(">I", crc32c.crc32c(body))), index)


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        _round_trip(fdp)
    else:
        _garbage(fdp)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
