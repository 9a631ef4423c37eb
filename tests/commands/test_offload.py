"""``aiobk offload store|sweep``, ``aiobk log offload|offload-policy`` and the offloaded copy in
``aiobk ledger show``, end to end: the commands as child processes against etcd and real
bookies, on a directory store and on S3 (moto); the log read back with every bookie stopped."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper
from aiobk.metadata import MetadataStore
from aiobk.tiered.open import open_object_store, redact
from tests.support.cli import aiobk, one_line_error
from tests.support.cluster import Cluster
from tests.support.names import unique_name
from tests.support.s3server import S3Server

STORES = ["directory", "s3"]


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each kind: a directory, or a bucket of its own on the session's moto."""
    if request.param == "directory":
        return f"file://{tmp_path / 'objects'}"
    server: S3Server = request.getfixturevalue("s3_server")
    return server.bucket_url(unique_name("cli-bucket-"), "offload")


async def write_log(bk: BookKeeper, name: str, sizes: list[list[int]]) -> list[bytes]:
    """A log of closed ledgers, one per item of ``sizes`` (the sizes of its records): each
    writer that takes the log starts a ledger and closes it when it closes."""
    sent: list[bytes] = []
    for ledger, records in enumerate(sizes):
        async with await bk.open_log_writer(name, record_format="raw") as writer:
            batch = [(b"%d-%d:" % (ledger, i)).ljust(size, b"x") for i, size in enumerate(records)]
            await asyncio.gather(*(writer.append(record) for record in batch))
        sent += batch
    return sent


def small(ledgers: int, records: int = 12) -> list[list[int]]:
    return [[20 + (i * 37) % 400 for i in range(records)] for _ in range(ledgers)]


async def tail(uri: str, name: str) -> list[bytes]:
    """Every record of the log, as ``aiobk log tail --json`` prints them."""
    done = await aiobk("log", "tail", name, "--metadata", uri, "--json")
    assert done.returncode == 0, done.stderr
    return [base64.b64decode(json.loads(line)["data_base64"]) for line in done.stdout.splitlines()]


async def held(url: str) -> tuple[set[str], list[str]]:
    """The offload objects a store holds, and its unfinished uploads."""
    store = open_object_store(url)
    try:
        keys = {key async for key in store.keys("ledgers/")}
        return keys, [upload.key for upload in await store.uploads("ledgers/")]
    finally:
        await store.close()


async def named(store: MetadataStore, ledgers: list[int]) -> set[str]:
    """The objects the ledgers' metadata names."""
    keys = set()
    for ledger_id in ledgers:
        record = (await store.read_ledger(ledger_id)).offload
        if record is not None:
            keys.add(record.key)
    return keys


def canonical(url: str) -> str:
    """The URL as the store itself writes it (what the cluster's setting records)."""
    return redact(open_object_store(url).url)


@pytest.fixture
async def bk(etcd_cluster: Cluster) -> AsyncIterator[BookKeeper]:
    async with BookKeeper(etcd_cluster.uri) as client:
        yield client


@pytest.mark.timeout(180)
async def test_offload_commands_end_to_end(
    etcd_cluster: Cluster, bk: BookKeeper, store_url: str
) -> None:
    uri = etcd_cluster.uri
    unset = await aiobk("offload", "store", "--metadata", uri)
    assert unset.returncode == 0, unset.stderr
    assert unset.stdout == (
        "no offload store is set for this cluster: set one with `aiobk offload store URL`\n"
    )
    assert (await aiobk("offload", "store", "--metadata", uri, "--json")).stdout == "null\n"
    sent = await write_log(bk, "orders", small(3))
    ledgers = list((await bk.store.read_log("orders")).ledgers)
    refused = await aiobk("log", "offload", "orders", "--metadata", uri)
    assert "no offload store is set" in one_line_error(refused.returncode, refused.stderr)

    # Set: probed, then recorded in the store's own form of the URL.
    set_ = await aiobk(
        "offload", "store", store_url, "--deletion-lag", "0", "--metadata", uri, "--json"
    )
    assert set_.returncode == 0, set_.stderr
    document = json.loads(set_.stdout)
    assert (document["url"], document["deletion_lag"]) == (canonical(store_url), 0.0)
    assert document["set_at"] > 0
    shown = await aiobk("offload", "store", "--metadata", uri)
    assert shown.stdout.splitlines()[0].split() == ["url", canonical(store_url)]
    assert shown.stdout.splitlines()[1].split() == ["deletion", "lag", "0s"]
    assert json.loads((await aiobk("offload", "store", "--metadata", uri, "--json")).stdout) == (
        document
    )
    assert (await held(store_url))[0] == set()  # the probe took its object away

    # The policy: shown, set, cleared.
    policy = ("log", "offload-policy", "orders", "--metadata", uri)
    assert (await aiobk(*policy)).stdout == "log orders: no offload policy\n"
    ruled = await aiobk(*policy, "--older-than", "4h", "--beyond", "10GiB", "--json")
    assert json.loads(ruled.stdout) == {
        "name": "orders", "offload_policy": {"older_than": 14400.0, "beyond_bytes": 10 << 30},
    }  # fmt: skip
    table = (await aiobk(*policy)).stdout.splitlines()
    assert table[1].split() == ["offload", "older", "than", "4h"]
    assert table[2].split()[:4] == ["offload", "beyond", "10737418240", "bytes"]
    log_record = await bk.store.read_log("orders")
    assert log_record.offload_policy is not None
    assert log_record.offload_policy.older_than == 14400.0
    both = await aiobk(*policy, "--clear", "--older-than", "1h")
    assert "--clear takes no" in one_line_error(both.returncode, both.stderr, 2)
    cleared = await aiobk(*policy, "--clear", "--json")
    assert json.loads(cleared.stdout) == {"name": "orders", "offload_policy": None}

    # The log offloaded: the first two ledgers, then the rest.
    first = await aiobk(
        "log", "offload", "orders", "--before", f"{ledgers[2]}:0", "--metadata", uri
    )
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].split() == ["ledger", "outcome", "entries", "bytes"]
    rows = [line.split() for line in lines[2:4]]
    assert [(int(r[0]), r[1], int(r[2])) for r in rows] == [
        (ledgers[0], "released", 12), (ledgers[1], "released", 12),
    ]  # fmt: skip
    assert lines[-1].startswith("log orders: 2 ledgers (2 released), ")
    whole = await aiobk("log", "offload", "orders", "--metadata", uri, "--json")
    report = json.loads(whole.stdout)
    assert [(x["ledger_id"], x["outcome"]) for x in report["ledgers"]] == [
        (ledgers[0], "done"), (ledgers[1], "done"), (ledgers[2], "released"),
    ]  # fmt: skip
    assert report["bytes"] == sum(x["bytes"] for x in report["ledgers"]) > 0
    assert (await held(store_url))[0] == await named(bk.store, ledgers)

    # ledger show names the copy.
    record = (await bk.store.read_ledger(ledgers[0])).offload
    assert record is not None
    shown_ledger = (await aiobk("ledger", "show", str(ledgers[0]), "--metadata", uri)).stdout
    assert shown_ledger.count("offloaded") == 1
    assert f"released to {canonical(store_url)}" in shown_ledger
    assert record.key in shown_ledger
    assert f"{record.size} bytes" in shown_ledger
    assert "offload copied" in shown_ledger
    assert "offload released" in shown_ledger
    document = json.loads(
        (await aiobk("ledger", "show", str(ledgers[0]), "--metadata", uri, "--json")).stdout
    )
    assert document["offload"]["state"] == "released"
    assert document["offload"]["key"] == record.key

    # The sweep: an object no metadata names (its ledger is gone), listed, then removed.
    orphan = f"ledgers/{ledgers[-1] + 1000:019d}/{'ab' * 16}.aobk"
    store = bk.objects.get(canonical(store_url))

    async def one() -> AsyncIterator[bytes]:
        yield b"left by a crash"

    await store.put(orphan, one())
    dry = await aiobk("offload", "sweep", "--dry-run", "--metadata", uri)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[0] == f"would remove object {orphan}"
    assert dry.stdout.splitlines()[-1] == (
        f"sweep of {canonical(store_url)} (dry run): would remove 1 objects and 0 unfinished "
        "uploads; 3 objects kept"
    )
    assert orphan in (await held(store_url))[0]
    swept = await aiobk("offload", "sweep", "--metadata", uri, "--json")
    assert json.loads(swept.stdout) == {
        "store": canonical(store_url), "dry_run": False, "objects": [orphan], "uploads": [],
        "kept": 3, "foreign": [],
    }  # fmt: skip
    assert (await held(store_url))[0] == await named(bk.store, ledgers)

    # Every bookie stopped: the log reads back whole from the store.
    await etcd_cluster.stop()
    assert await tail(uri, "orders") == sent


@pytest.mark.timeout(120)
async def test_a_store_that_does_not_answer_is_refused_in_one_line(
    etcd_cluster: Cluster, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = etcd_cluster.uri
    for url, status, message in [
        ("ftp://host/dir", 2, "ftp://host/dir: not an object store URL"),
        ("file://relative/dir", 2, "a directory store's URL is file:///ABSOLUTE/DIRECTORY"),
        (f"s3://absent-bucket/x?endpoint={s3_server.endpoint}", 1, "the store failed its probe"),
        ("s3://b/x?endpoint=http://127.0.0.1:1", 1, "the store failed its probe"),
    ]:
        done = await aiobk("offload", "store", url, "--metadata", uri)
        assert message in one_line_error(done.returncode, done.stderr, status), url
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    keyless = await aiobk("offload", "store", s3_server.bucket_url("keyless"), "--metadata", uri)
    assert "AWS_ACCESS_KEY_ID" in one_line_error(keyless.returncode, keyless.stderr, 2)
    assert (await aiobk("offload", "store", "--metadata", uri, "--json")).stdout == "null\n"
    lagging = await aiobk("offload", "store", "--deletion-lag", "1h", "--metadata", uri)
    assert "--deletion-lag is set with" in one_line_error(lagging.returncode, lagging.stderr, 2)
    wrong = await aiobk("offload", "store", "file:///tmp/x", "--deletion-lag", "soon")
    assert "not a duration" in one_line_error(wrong.returncode, wrong.stderr, 2)
    swept = await aiobk("offload", "sweep", "--metadata", uri)
    assert "no offload store is set" in one_line_error(swept.returncode, swept.stderr)
