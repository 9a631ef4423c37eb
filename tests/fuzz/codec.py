"""atheris target: arbitrary bytes through the frame decoder, the request and response decoders,
the entry parser, ADD_BATCH's unpacking and the journal scanner. The only acceptable failures
are the typed errors each documents (a malformed input is refused, never a crash, hang or other
exception).

    python -m tests.fuzz.codec -runs=200000          # make fuzz
    python -m tests.fuzz.codec -max_total_time=600
"""

from __future__ import annotations

import contextlib
import sys

import atheris

with atheris.instrument_imports():
    from aiobk.bookie.journal.format import scan
    from aiobk.protocol import (
        BatchError,
        FrameDecoder,
        FrameError,
        MalformedEntryError,
        MalformedMessageError,
        decode_request,
        decode_response,
        parse_entry,
        unpack_bodies,
        unpack_statuses,
    )

MAX_FRAME = 1 << 16


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    split = fdp.ConsumeIntInRange(0, len(data))
    rest = fdp.ConsumeBytes(len(data))
    decoder = FrameDecoder(MAX_FRAME)
    try:
        frames = decoder.feed(rest[:split]) + decoder.feed(rest[split:])
    except FrameError:
        frames = []
    for payload in [*frames, rest]:
        for decode in (decode_request, decode_response):
            with contextlib.suppress(MalformedMessageError):
                decode(payload, MAX_FRAME)
        with contextlib.suppress(MalformedEntryError):
            parse_entry(payload)
        with contextlib.suppress(BatchError):
            unpack_bodies(payload, split)
        with contextlib.suppress(BatchError):
            unpack_statuses(payload, split)
    scan(rest)  # stops at the first damaged record; never raises


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
