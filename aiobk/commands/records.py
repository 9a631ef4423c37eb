"""How ``ledger read`` and ``log tail`` print what they read: one entry or record a line.

Text lines are tab-separated and line-safe (``text.printable``: UTF-8 as it is, every other byte
and every control character backslash-escaped, so a record never spans two lines)::

    LABEL<TAB>DATA                                  a raw record, or a ledger's entry
    LABEL<TAB>TIME<TAB>KEY<TAB>HEADERS<TAB>DATA     a record with a key, headers and a time

LABEL is a log position (``LEDGER:ENTRY``) or an entry id; TIME is the record's timestamp in
UTC, ISO 8601 with milliseconds; KEY is ``-`` when the record has none; HEADERS is
``NAME=VALUE`` pairs joined by ``,``, or ``-`` when there are none. With ``--json`` each line
is a JSON object instead, every byte string in base64; a record a producer appended also has
its ``producer_id`` and ``sequence`` there.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Mapping
from typing import Any

from aiobk.client.log.format import Envelope
from aiobk.client.log.position import LogRecord
from aiobk.commands.text import printable

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def format_time(milliseconds: int) -> str:
    """``milliseconds`` since the epoch as UTC ISO 8601 (``2026-01-01T00:00:00.000Z``); as the
    number itself when a calendar cannot hold it."""
    try:
        moment = _EPOCH + datetime.timedelta(milliseconds=milliseconds)
    except OverflowError:
        return str(milliseconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _fields_json(key: bytes | None, headers: Mapping[str, bytes], timestamp: int) -> dict[str, Any]:
    return {
        "key_base64": None if key is None else _b64(key),
        "headers_base64": {name: _b64(value) for name, value in headers.items()},
        "timestamp": timestamp,
    }


def _fields_text(key: bytes | None, headers: Mapping[str, bytes], timestamp: int) -> str:
    shown_key = "-" if key is None else printable(key)
    shown_headers = (
        ",".join(
            f"{printable(name.encode())}={printable(value)}" for name, value in headers.items()
        )
        or "-"
    )
    return f"{format_time(timestamp)}\t{shown_key}\t{shown_headers}"


def record_line(record: LogRecord, as_json: bool) -> str:
    """A record of a log, as ``log tail`` prints it."""
    position = record.position
    if as_json:
        document: dict[str, Any] = {
            "position": str(position),
            "ledger_id": position.ledger_id,
            "entry_id": position.entry_id,
            "data_base64": _b64(record.data),
        }
        if record.timestamp is not None:
            document.update(_fields_json(record.key, record.headers, record.timestamp))
        if record.producer_id is not None:
            document.update(producer_id=record.producer_id, sequence=record.sequence)
        return json.dumps(document)
    if record.timestamp is None:
        return f"{position}\t{printable(record.data)}"
    fields = _fields_text(record.key, record.headers, record.timestamp)
    return f"{position}\t{fields}\t{printable(record.data)}"


def entry_line(entry_id: int, data: bytes, as_json: bool, record: Envelope | None = None) -> str:
    """An entry of a ledger, as ``ledger read`` prints it. ``record``: the entry decoded, when
    the ledger belongs to a log of records with a key, headers and a time -- the text line then
    shows the record, and the JSON object adds it (``record``) to the entry's bytes."""
    if as_json:
        document: dict[str, Any] = {"entry_id": entry_id, "data_base64": _b64(data)}
        if record is not None:
            document["record"] = {
                "data_base64": _b64(record.data),
                **_fields_json(record.key, record.headers, record.timestamp),
            }
            if record.producer_id is not None:
                document["record"].update(producer_id=record.producer_id, sequence=record.sequence)
        return json.dumps(document)
    if record is None:
        return f"{entry_id}\t{printable(data)}"
    fields = _fields_text(record.key, record.headers, record.timestamp)
    return f"{entry_id}\t{fields}\t{printable(record.data)}"


__all__ = ["entry_line", "format_time", "record_line"]
