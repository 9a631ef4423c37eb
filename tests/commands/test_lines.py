"""What ``aiobk log tail`` and ``aiobk ledger read`` print is line-safe: one record is one line
in text mode, UTF-8 shown as it is and every other byte, and every control character,
backslash-escaped, so that newlines, tabs, NUL bytes, terminal escapes and bytes that are not
UTF-8 in a record can neither split it nor reach the terminal; records with a key, headers and
a time show all three, and ``ledger read`` on a log of such records shows the records, not the
envelope's binary header."""

from __future__ import annotations

import base64
import json
import re

from hypothesis import given
from hypothesis import strategies as st

from aiobk.client import BookKeeper, LogPosition
from aiobk.commands.text import printable
from tests.support.cli import aiobk
from tests.support.cluster import Cluster

NASTY = b"one\ntwo\tthree\r\x00\x1b[31mred\x7f \xc2\x85 \xe2\x80\xa8 caf\xc3\xa9 \xff\xfe \\x41"
SHOWN = r"one\ntwo\tthree\r\x00\x1b[31mred\x7f \u0085 \u2028 café \xff\xfe \\x41"
# Nothing a terminal acts on, nothing a reader takes as the end of a line.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def unescape(text: str) -> bytes:
    """The inverse of ``printable``, as its documentation states it."""
    out = bytearray()
    index = 0
    named = {"\\": b"\\", "n": b"\n", "t": b"\t", "r": b"\r"}
    while index < len(text):
        char = text[index]
        if char != "\\":
            out += char.encode()
            index += 1
            continue
        kind = text[index + 1]
        if kind in named:
            out += named[kind]
            index += 2
        elif kind == "x":
            out.append(int(text[index + 2 : index + 4], 16))
            index += 4
        else:
            assert kind == "u", text
            out += chr(int(text[index + 2 : index + 6], 16)).encode()
            index += 6
    return bytes(out)


@given(st.binary(max_size=64) | st.text(max_size=32).map(lambda t: t.encode("utf-8", "replace")))
def test_printable_is_one_safe_line_that_reads_back(data: bytes) -> None:
    shown = printable(data)
    assert UNSAFE.search(shown) is None
    assert len(shown.splitlines()) <= 1
    assert unescape(shown) == data


async def test_log_tail_prints_one_line_a_record_with_its_key_headers_and_time(
    etcd_cluster: Cluster,
) -> None:
    uri = etcd_cluster.uri
    async with BookKeeper(uri) as bk:
        writer = await bk.open_log_writer("lines")  # envelope records, the default
        first = await writer.append(
            NASTY, key=b"user\n7", headers={"trace": b"a\tb", "bin": b"\x00\x01"}, timestamp=5
        )
        second = await writer.append(b"plain", timestamp=1_767_225_600_123)
        await writer.close()
        raw = await bk.open_log_writer("raw-lines", record_format="raw")
        raw_at = await raw.append(NASTY)
        await raw.close()

    tail = await aiobk("log", "tail", "lines", "--metadata", uri)
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.split("\n") == [
        f"{first}\t1970-01-01T00:00:00.005Z\tuser\\n7\ttrace=a\\tb,bin=\\x00\\x01\t{SHOWN}",
        f"{second}\t2026-01-01T00:00:00.123Z\t-\t-\tplain",
        "",
    ]
    raw_tail = await aiobk("log", "tail", "raw-lines", "--metadata", uri)
    assert raw_tail.stdout == f"{raw_at}\t{SHOWN}\n"

    # --json carries the bytes exactly, in base64.
    documents = [
        json.loads(line)
        for line in (
            await aiobk("log", "tail", "lines", "--metadata", uri, "--json")
        ).stdout.splitlines()
    ]
    assert base64.b64decode(documents[0]["data_base64"]) == NASTY
    assert base64.b64decode(documents[0]["key_base64"]) == b"user\n7"
    assert documents[1]["key_base64"] is None
    assert documents[1]["timestamp"] == 1_767_225_600_123

    # A ledger of that log, read as a ledger: the records, not their envelopes' bytes.
    read = await aiobk("ledger", "read", str(first.ledger_id), "--metadata", uri)
    assert read.returncode == 0, read.stderr
    assert read.stdout.split("\n") == [
        f"0\t1970-01-01T00:00:00.005Z\tuser\\n7\ttrace=a\\tb,bin=\\x00\\x01\t{SHOWN}",
        "1\t2026-01-01T00:00:00.123Z\t-\t-\tplain",
        "",
    ]
    assert UNSAFE.search(read.stdout.replace("\n", "").replace("\t", "")) is None
    as_json = await aiobk("ledger", "read", str(first.ledger_id), "--metadata", uri, "--json")
    entry = json.loads(as_json.stdout.splitlines()[0])
    assert base64.b64decode(entry["data_base64"])[0] == 0xE1  # the entry as stored ...
    assert base64.b64decode(entry["record"]["data_base64"]) == NASTY  # ... and its record
    assert entry["record"]["headers_base64"] == {
        "trace": base64.b64encode(b"a\tb").decode(),
        "bin": base64.b64encode(b"\x00\x01").decode(),
    }
    # A raw log's ledger: its entries, escaped the same way.
    raw_read = await aiobk("ledger", "read", str(raw_at.ledger_id), "--metadata", uri)
    assert raw_read.stdout == f"0\t{SHOWN}\n"
    assert LogPosition(raw_at.ledger_id, 0) == raw_at
