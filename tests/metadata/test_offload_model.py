"""Offloading's values: a ledger's OffloadRecord, a log's OffloadPolicy, the cluster's
OffloadStoreSettings -- their JSON, what parsing refuses, what every other change keeps, and
that metadata without them is written exactly as before they existed (pure)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiobk.metadata import (
    Fragment,
    LedgerMetadata,
    LedgerState,
    LogMetadata,
    MetadataFormatError,
    OffloadPolicy,
    OffloadRecord,
    OffloadState,
    OffloadStoreSettings,
    ProducerState,
)
from aiobk.metadata.keys import KeyLayout
from aiobk.metadata.records import check_offload_url
from tests.metadata.test_model import ledgers

E3 = ("a:1", "b:1", "c:1")
COPIED = OffloadRecord(
    "9f2c", "s3://bucket/p?endpoint=http://h:9000", "ledgers/0000000000000000042/9f2c.aobk",
    OffloadState.COPIED, 1_700_000_000_000, copied=1_700_000_060_000, size=4096,
    index_offset=3900, index_length=160, index_crc=0xFFFFFFFF, entries=10, block_size=1 << 22,
)  # fmt: skip

# Written by the code before offloading existed, byte for byte: metadata without an offload
# record or policy must stay exactly so, for the versions that read it.
LEDGER_BYTES = (
    b'{"ack_quorum":2,"creation_time":5,"custom_metadata":{"app":"eA=="},"digest_type":"CRC32C",'
    b'"durability":"PERSISTENT","ensemble_size":3,"format":1,"fragments":[{"ensemble":["a:1",'
    b'"b:1","c:1"],"first_entry_id":0},{"ensemble":["a:1","b:1","d:1"],"first_entry_id":7}],'
    b'"last_entry_id":9,"length":120,"password_digest":"cGQ=","password_salt":"c2FsdA==",'
    b'"state":"CLOSED","write_quorum":3}'
)
LOG_BYTES = (
    b'{"format":1,"ledgers":[4,9],"name":"orders","producers":{"as_of":9,"last":{"p":[3,77]}},'
    b'"record_format":"envelope","writer":9}'
)


def pinned_ledger() -> LedgerMetadata:
    return LedgerMetadata(
        3, 3, 2, (Fragment(0, E3), Fragment(7, ("a:1", "b:1", "d:1"))), LedgerState.CLOSED, 9,
        120, creation_time=5, password_digest=b"pd", password_salt=b"salt",
        custom_metadata={"app": b"x"},
    )  # fmt: skip


def pinned_log() -> LogMetadata:
    return LogMetadata(
        "orders", (4, 9), record_format="envelope", writer=9,
        producers=ProducerState(9, {"p": (3, 77)}),
    )  # fmt: skip


def test_metadata_without_offloading_is_written_as_before() -> None:
    assert pinned_ledger().to_json() == LEDGER_BYTES
    assert pinned_log().to_json() == LOG_BYTES
    assert LogMetadata("plain", (1,)).to_json() == b'{"format":1,"ledgers":[1],"name":"plain"}'
    # Read and written back unchanged, and a record removed leaves no trace.
    assert LedgerMetadata.from_json(LEDGER_BYTES).to_json() == LEDGER_BYTES
    assert pinned_ledger().with_offload(COPIED).with_offload(None).to_json() == LEDGER_BYTES
    assert LogMetadata.from_json(LOG_BYTES).to_json() == LOG_BYTES
    policy = pinned_log().with_offload_policy(OffloadPolicy(older_than=60))
    assert policy.with_offload_policy(None).to_json() == LOG_BYTES


@st.composite
def offload_records(draw: st.DrawFn) -> OffloadRecord:
    counts = st.integers(0, 2**63)
    moments = st.none() | st.integers(0, 2**45)
    text = st.text(min_size=1, max_size=20)
    return OffloadRecord(
        draw(text), draw(text), draw(text), draw(st.sampled_from(list(OffloadState))),
        draw(st.integers(0, 2**45)), draw(moments), draw(moments), draw(counts), draw(counts),
        draw(counts), draw(st.integers(0, 2**32 - 1)), draw(counts), draw(counts),
    )  # fmt: skip


@given(ledgers(), offload_records())
def test_ledger_with_offload_round_trip(metadata: LedgerMetadata, record: OffloadRecord) -> None:
    offloaded = metadata.with_offload(record)
    data = offloaded.to_json()
    assert json.loads(data)["offload"]["state"] == record.state.value
    read = LedgerMetadata.from_json(data)
    assert read == offloaded
    assert read.offload == record
    assert read != metadata
    assert read.extra == {}


@given(
    st.none() | st.floats(0, 1e9, allow_nan=False) | st.integers(0, 10**9),
    st.none() | st.integers(0, 2**62),
)
def test_log_policy_round_trip(older_than: float | None, beyond_bytes: int | None) -> None:
    record = LogMetadata("orders", (1, 2), writer=2).with_offload_policy(
        OffloadPolicy(older_than, beyond_bytes)
    )
    read = LogMetadata.from_json(record.to_json())
    assert read == record
    assert read.offload_policy == OffloadPolicy(older_than, beyond_bytes)
    written = json.loads(record.to_json())["offload_policy"]
    assert ("older_than" in written, "beyond_bytes" in written) == (
        older_than is not None,
        beyond_bytes is not None,
    )


def test_every_other_change_of_a_ledger_keeps_its_offload_record() -> None:
    open_ = LedgerMetadata(3, 3, 2, (Fragment(0, E3),)).with_offload(COPIED)
    for changed in (
        open_.in_recovery(),
        open_.closed(9, 100),
        open_.with_fragment(5, ("a:1", "b:1", "d:1")),
        open_.with_fragment(0, ("a:1", "b:1", "d:1")),
        open_.with_version(7),
        open_.replace(custom_metadata={"k": b"v"}),
    ):
        assert changed.offload == COPIED
        assert LedgerMetadata.from_json(changed.to_json()).offload == COPIED
    released = open_.closed(9, 100).with_offload(
        dataclasses.replace(COPIED, state=OffloadState.RELEASED, released=1_700_000_999_000)
    )
    assert released.offload is not None
    assert released.offload.state is OffloadState.RELEASED
    assert released.with_offload(None).offload is None
    assert "offload" not in json.loads(released.with_offload(None).to_json())


def test_every_other_change_of_a_log_keeps_its_policy() -> None:
    policy = OffloadPolicy(older_than=3600.0, beyond_bytes=1 << 30)
    record = LogMetadata("orders", (1, 2), writer=2).with_offload_policy(policy)
    for changed in (
        record.with_ledgers((2,)),
        record.taken((2, 9), 9),
        record.with_producers(ProducerState(9, {"p": (1, 2)})),
    ):
        assert changed.offload_policy == policy
        assert LogMetadata.from_json(changed.to_json()).offload_policy == policy


def test_fields_a_newer_version_adds_to_a_record_are_kept() -> None:
    document = json.loads(pinned_ledger().with_offload(COPIED).to_json())
    document["offload"]["tier"] = "cold"
    read = LedgerMetadata.from_json(json.dumps(document).encode())
    assert read.offload == COPIED
    closed_again = json.loads(read.replace(length=121).to_json())
    assert closed_again["offload"]["tier"] == "cold"

    store = json.loads(OffloadStoreSettings("file:///srv/offload").to_json())
    store["store_id"] = "abc"
    settings = OffloadStoreSettings.from_json(json.dumps(store).encode(), version=4)
    assert (settings.url, settings.deletion_lag, settings.set_at) == (
        "file:///srv/offload",
        14400.0,
        0,
    )
    assert (settings.version, dict(settings.extra)) == (4, {"store_id": "abc"})
    assert json.loads(settings.to_json())["store_id"] == "abc"


def _ledger_with(offload: object) -> bytes:
    document = json.loads(pinned_ledger().to_json())
    document["offload"] = offload
    return json.dumps(document).encode()


def _copied(**changes: object) -> dict[str, Any]:
    document = COPIED.to_dict()
    document.update(changes)
    return {k: v for k, v in document.items() if v is not ...}


@pytest.mark.parametrize(
    ("offload", "message"),
    [
        (_copied(state="archived"), "unknown offload state 'archived'"),
        (_copied(state="COPIED"), "unknown offload state 'COPIED'"),
        (_copied(state=...), "unknown offload state None"),
        (_copied(uid=...), "offload uid must be a string"),
        (_copied(uid=""), "offload uid must be a non-empty string"),
        (_copied(store=7), "offload store must be a string"),
        (_copied(key=None), "offload key must be a string"),
        (_copied(started=...), "expected an integer, got None"),
        (_copied(started="1"), "expected an integer"),
        (_copied(size=-1), "offload size must not be negative"),
        (_copied(entries=True), "expected an integer, got True"),
        (_copied(index_crc=1.5), "expected an integer"),
        (_copied(copied="now"), "expected an integer"),
        ("copied", "offload must be an object"),
        ([1, 2], "offload must be an object"),
    ],
)
def test_malformed_offload_records_are_refused(offload: object, message: str) -> None:
    with pytest.raises(MetadataFormatError, match="unreadable ledger metadata") as caught:
        LedgerMetadata.from_json(_ledger_with(offload))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_null_offload_is_none() -> None:
    assert LedgerMetadata.from_json(_ledger_with(None)).offload is None


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"older_than": -1}, "older_than must not be negative"),
        ({"older_than": "1h"}, "older_than must be a finite number"),
        ({"older_than": True}, "older_than must be a finite number"),
        ({"beyond_bytes": 1.5}, "beyond_bytes must be an integer"),
        ({"beyond_bytes": -5}, "beyond_bytes must not be negative"),
        ("often", "offload_policy must be an object"),
    ],
)
def test_malformed_policies_are_refused(policy: object, message: str) -> None:
    document = json.loads(pinned_log().to_json())
    document["offload_policy"] = policy
    with pytest.raises(MetadataFormatError, match="unreadable log record") as caught:
        LogMetadata.from_json(json.dumps(document).encode())
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    nan = LOG_BYTES.replace(b'"name"', b'"offload_policy":{"older_than":NaN},"name"')
    with pytest.raises(MetadataFormatError, match="finite"):
        LogMetadata.from_json(nan)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"format":1}', "KeyError('url')"),
        (b'{"format":1,"url":5}', "url must be a string"),
        (b'{"format":1,"url":""}', "non-empty"),
        (b'{"format":1,"url":"file:///x","deletion_lag":-1}', "deletion_lag must not be neg"),
        (b'{"format":1,"url":"file:///x","deletion_lag":"4h"}', "deletion_lag must be a finite"),
        (b'{"format":1,"url":"file:///x","set_at":1.5}', "set_at must be an integer"),
        (b'{"format":2,"url":"file:///x"}', "format 2 is not supported"),
        (b"[]", "not a JSON object"),
    ],
)
def test_malformed_store_records_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(MetadataFormatError, match="offload store record") as caught:
        OffloadStoreSettings.from_json(data)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_values_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match="unknown offload state"):
        OffloadRecord("u", "s", "k", "copied", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="offload started must not be negative"):
        OffloadRecord("u", "s", "k", OffloadState.COPYING, -1)
    with pytest.raises(ValueError, match="must be an OffloadRecord"):
        LedgerMetadata(3, 3, 2, (Fragment(0, E3),), offload={"uid": "u"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beyond_bytes must not be negative"):
        OffloadPolicy(beyond_bytes=-1)
    with pytest.raises(ValueError, match="deletion_lag must not be negative"):
        OffloadStoreSettings("file:///x", deletion_lag=-0.5)
    assert OffloadStoreSettings("file:///x", deletion_lag=0).deletion_lag == 0


@pytest.mark.parametrize(
    "url", ["file:///srv/offload", "s3://bucket", "s3://bucket/p?endpoint=http://h:9000&region=r"]
)
def test_offload_urls_of_the_kinds_written_to(url: str) -> None:
    assert check_offload_url(url) == url


@pytest.mark.parametrize(
    "url",
    ["", "memory://store", "http://h/p", "gs://b", "/srv/offload", "s3:/b", "s3://",
     "file:///a b", "s3://b\n/p"],
)  # fmt: skip
def test_other_urls_are_refused_on_one_line(url: str) -> None:
    with pytest.raises(ValueError, match="offload store") as caught:
        check_offload_url(url)
    assert "\n" not in str(caught.value)


def test_offload_keys() -> None:
    keys = KeyLayout("/aiobk/")
    assert keys.offload_store == b"/aiobk/offload/store"
    assert keys.offloading(42) == b"/aiobk/offload/ledgers/0000000000000000042"
    assert KeyLayout.ledger_id_of(keys.offloading_prefix, keys.offloading(42)) == 42
    assert keys.offloading(9) < keys.offloading(10)
    assert not keys.offloading(42).startswith(keys.ledgers)
    assert not keys.offload_store.startswith(keys.offloading_prefix)
    with pytest.raises(ValueError, match="not negative"):
        keys.offloading(-1)
