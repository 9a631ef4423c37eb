"""LedgerMetadata and the records: validation and serialization (pure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.metadata import (
    BookieServiceInfo,
    Cookie,
    Fragment,
    LedgerMetadata,
    LedgerState,
    LogMetadata,
    MetadataFormatError,
)
from aiobk.metadata.keys import KeyLayout
from aiobk.protocol import DigestType, Durability

E3 = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


@st.composite
def ledgers(draw: st.DrawFn) -> LedgerMetadata:
    aq = draw(st.integers(1, 3))
    wq = draw(st.integers(aq, 4))
    e = draw(st.integers(wq, 5))
    starts = sorted(set(draw(st.lists(st.integers(1, 10**6), max_size=3))))
    fragments = tuple(
        Fragment(start, tuple(f"10.0.0.{n}:{3181 + i}" for i in range(e)))
        for n, start in enumerate([0, *starts])
    )
    state = draw(st.sampled_from(list(LedgerState)))
    last = draw(st.integers(-1, 10**9)) if state is LedgerState.CLOSED else None
    return LedgerMetadata(
        e,
        wq,
        aq,
        fragments,
        state,
        last,
        draw(st.integers(0, 2**40)),
        draw(st.sampled_from(list(Durability))),
        draw(st.sampled_from(list(DigestType))),
        draw(st.binary(max_size=32)),
        draw(st.dictionaries(st.text(max_size=5), st.binary(max_size=5), max_size=3)),
        draw(st.integers(0, 2**42)),
    )


@given(ledgers())
def test_json_round_trip(metadata: LedgerMetadata) -> None:
    data = metadata.to_json()
    json.loads(data)  # plain JSON: readable with etcdctl get
    assert LedgerMetadata.from_json(data) == metadata


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ensemble_size": 2}, "ensemble >= write quorum"),
        ({"ack_quorum": 0}, ">= 1"),
        ({"fragments": ()}, "at least one fragment"),
        ({"fragments": (Fragment(1, E3),)}, "starts at entry 0"),
        ({"fragments": (Fragment(0, E3), Fragment(0, E3))}, "strictly increase"),
        ({"fragments": (Fragment(0, E3[:2]),)}, "does not have 3"),
        ({"fragments": (Fragment(0, (E3[0], E3[0], E3[1])),)}, "twice"),
        ({"state": LedgerState.CLOSED}, "closed ledger has a last entry"),
        ({"last_entry_id": 4}, "no last entry id yet"),
        ({"length": -1}, "negative"),
    ],
)
def test_validation(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "ensemble_size": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "fragments": (Fragment(0, E3),),
    }
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        LedgerMetadata(**base)  # type: ignore[arg-type]


def test_fragments_and_repr() -> None:
    md = LedgerMetadata(3, 2, 2, (Fragment(0, E3),)).with_version(7)
    changed = md.with_fragment(10, ("127.0.0.1:3181", "127.0.0.1:3184", "127.0.0.1:3183"))
    assert changed.fragment_for(9).first_entry_id == 0
    assert changed.fragment_for(10).first_entry_id == 10
    assert changed.ensemble[1] == "127.0.0.1:3184"
    replaced = changed.with_fragment(10, E3)
    assert len(replaced.fragments) == 2
    assert "127.0.0.1:3184" in changed.bookies()
    assert "127.0.0.1:3182" in repr(md)
    assert "OPEN" in repr(md)
    assert "v7" in repr(md)
    closed = md.in_recovery().closed(-1, 0)
    assert closed.is_closed
    assert "last=-1" in repr(closed)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"format": 99}',
        b'{"format": 1}',
        json.dumps(
            {
                **json.loads(LedgerMetadata(3, 3, 2, (Fragment(0, E3),)).to_json()),
                "ensemble_size": "3",
            }
        ).encode(),
        json.dumps(
            {
                **json.loads(LedgerMetadata(3, 3, 2, (Fragment(0, E3),)).to_json()),
                "password_digest": "!!",
            }
        ).encode(),
    ],
)
def test_unreadable_metadata_is_a_format_error(data: bytes) -> None:
    with pytest.raises(MetadataFormatError):
        LedgerMetadata.from_json(data)


def test_records_round_trip_and_reject_garbage() -> None:
    info = BookieServiceInfo("h:1", "h:1", "readonly", "0.1", 5, 10)
    assert BookieServiceInfo.from_json(info.to_json()) == info
    cookie = Cookie("h:1", "h:1", ("/j",), ("/d",), "abc")
    assert Cookie.from_json(cookie.to_json()) == cookie
    other = Cookie("h:1", "h:2", ("/j",), ("/x",), "abc")
    assert cookie.differences(other) == [
        "address: 'h:1' != 'h:2'",
        "data_dirs: ('/d',) != ('/x',)",
    ]
    log = LogMetadata("orders", (1, 2))
    assert LogMetadata.from_json(log.to_json()) == log
    for loader in (BookieServiceInfo.from_json, Cookie.from_json, LogMetadata.from_json):
        with pytest.raises(MetadataFormatError):
            loader(b"{")
        with pytest.raises(MetadataFormatError):
            loader(b'{"format": 1}')
    with pytest.raises(MetadataFormatError, match="unknown bookie state"):
        BookieServiceInfo.from_json(info.to_json().replace(b"readonly", b"sleepy"))
    with pytest.raises(MetadataFormatError):
        LogMetadata.from_json(b'{"format":1,"name":"x","ledgers":["a"]}')


def test_key_layout() -> None:
    keys = KeyLayout("/aiobk/")
    assert keys.ledger(42) == b"/aiobk/ledgers/0000000000000000042"
    assert keys.ledger_id(keys.ledger(42)) == 42
    assert keys.ledger(9) < keys.ledger(10)
    assert KeyLayout("").root == b"/aiobk"
    with pytest.raises(ValueError, match="not negative"):
        keys.ledger(-1)
    with pytest.raises(ValueError, match="without '/'"):
        keys.bookie("a/b")
    assert keys.log_name(keys.log("orders.v2")) == "orders.v2"


def test_fields_a_newer_version_wrote_survive_an_update() -> None:
    """A field this version does not know is kept as read and written back by every change,
    so an older client closing a ledger or truncating a log keeps what a newer one recorded."""
    metadata = LedgerMetadata(3, 3, 2, (Fragment(0, E3),), creation_time=5)
    document = json.loads(metadata.to_json())
    document["offloaded"] = {"store": "s3://b/p", "object": "ledger-7"}
    read = LedgerMetadata.from_json(json.dumps(document).encode())
    assert read == metadata  # the known fields, unchanged
    closed = read.closed(10, 100)
    assert json.loads(closed.to_json())["offloaded"] == document["offloaded"]
    assert json.loads(closed.to_json())["state"] == "CLOSED"

    log = json.loads(LogMetadata("orders", (1, 2), record_format="envelope", writer=1).to_json())
    log["retention"] = {"days": 7}
    record = LogMetadata.from_json(json.dumps(log).encode())
    assert (record.ledgers, record.writer, record.record_format) == ((1, 2), 1, "envelope")
    truncated = json.loads(record.with_ledgers((2,)).to_json())
    assert truncated["retention"] == {"days": 7}
    assert truncated["ledgers"] == [2]
    taken = LogMetadata.from_json(record.taken((2, 9), 9).to_json())
    assert (taken.writer, taken.extra) == (9, {"retention": {"days": 7}})
    with pytest.raises(MetadataFormatError, match="writer"):
        LogMetadata.from_json(b'{"format":1,"name":"x","ledgers":[],"writer":"me"}')
