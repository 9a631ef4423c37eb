"""A metadata URI whose prefix holds no cluster is said to be one, and a cluster knows it is one.

The first bookie to boot under a prefix writes the cluster record (an instance id, as
BookKeeper's INSTANCEID). Clients and commands read it when they connect: a prefix where no
cluster was ever set up -- a typo in the URI, most likely -- is an error in one line, where it
used to list nothing and exit 0. A cluster set up by a version that wrote no record is known by
the keys its bookies and clients wrote, and gets its record from the first bookie of this
version that boots in it. A bookie started with no metadata service says it serves
unregistered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aiobk.client import BookKeeper, errors
from aiobk.metadata import (
    BookieServiceInfo,
    ClusterRecord,
    EtcdProcess,
    MetadataFormatError,
    open_store,
)
from tests.support.cli import aiobk
from tests.support.cluster import Cluster, forget, start_cluster
from tests.support.names import unique_name

LISTINGS = [("bookies", "list"), ("ledger", "list"), ("log", "list"), ("autorecovery", "status")]


async def test_commands_on_a_prefix_without_a_cluster_say_so(
    etcd_cluster: Cluster, etcd_server: EtcdProcess
) -> None:
    wrong = etcd_server.uri(unique_name("wrongprefix"))
    prefix = wrong.rpartition("/")[2]
    for args in [*LISTINGS, ("ledger", "show", "1"), ("log", "tail", "orders")]:
        result = await aiobk(*args, "--metadata", wrong)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert result.stdout == ""
        assert result.stderr == (
            f"aiobk: error: {wrong}: no aiobk cluster was ever set up under prefix /{prefix} "
            "(no bookie has started with this metadata URI); check it\n"
        ), args
    for args in LISTINGS:  # the right prefix: the cluster its bookies set up
        result = await aiobk(*args, "--metadata", etcd_cluster.uri)
        assert result.returncode == 0, (args, result.stderr)


async def test_connecting_to_a_prefix_without_a_cluster_fails(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    for uri in (etcd_server.uri(unique_name("empty")), f"memory://{unique_name('empty')}"):
        with pytest.raises(errors.NoSuchClusterError, match="no aiobk cluster was ever set up"):
            await BookKeeper.connect(uri)
        with pytest.raises(errors.NoSuchClusterError):
            async with BookKeeper(uri):
                pass
    # In one process, memory:// as a notebook uses it: bookies first, then the client.
    cluster = await start_cluster(tmp_path, 3)
    try:
        async with BookKeeper(cluster.uri) as bk:
            assert bk.cluster is not None
            async with await bk.create_ledger() as ledger:
                await ledger.append(b"x")
    finally:
        await cluster.stop()
        forget(cluster)


async def test_the_first_bookie_sets_the_cluster_up_once(tmp_path: Path) -> None:
    cluster = await start_cluster(tmp_path, 2)
    try:
        async with cluster.store as store:
            record = await store.read_cluster()
            assert record is not None
            assert len(record.instance_id) == 32
            await cluster.bookies[0].stop()
            await cluster.restart(cluster.bookies[0])
            await cluster.add_bookie()
            assert await store.read_cluster() == record  # never changed
            async with BookKeeper(cluster.uri) as bk:
                assert bk.cluster == record
    finally:
        await cluster.stop()
        forget(cluster)


async def test_a_cluster_from_before_the_record_is_still_one(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """What a version without the record leaves behind -- any one of a bookie's cookie, its
    registration, a ledger, a log, the id counter -- marks a cluster; the first bookie of this
    version to boot there writes the record, and what the prefix held reads as before."""
    for kind in ("cookie", "registration", "ledger", "log", "counter"):
        uri = etcd_server.uri(unique_name("legacy"))
        async with open_store(uri) as store:
            registration = None
            if kind == "cookie":
                await store.kv.create(store.keys.cookie("127.0.0.1:1"), b"{}")
            elif kind == "registration":
                info = BookieServiceInfo("127.0.0.1:1", "127.0.0.1:1")
                registration = await store.register_bookie(info, ttl=30)
            elif kind == "ledger":
                await store.kv.create(store.keys.ledger(7), b"{}")
            elif kind == "log":
                await store.create_log("orders")
            else:
                await store.allocate_ledger_id()
            assert await store.read_cluster() is None
            async with BookKeeper(uri) as bk:
                assert bk.cluster is None  # a cluster, from before the record
            listed = await aiobk("ledger", "list", "--metadata", uri)
            assert (listed.returncode, listed.stderr) == (0, ""), kind
            if registration is not None:
                await registration.close()

    cluster = Cluster(tmp_path, etcd_server.uri(unique_name("legacy")))
    try:
        async with open_store(cluster.uri) as store:
            await store.create_log("orders", record_format="envelope")
            await cluster.add_bookie()  # this version's first bookie: the record appears
            assert await store.read_cluster() is not None
            assert (await store.read_log("orders")).record_format == "envelope"
    finally:
        await cluster.stop()


def test_the_cluster_record_keeps_what_it_does_not_know() -> None:
    record = ClusterRecord.from_json(b'{"format":1,"instance_id":"abc","zone":"eu"}', 4)
    assert record == ClusterRecord("abc")
    assert ClusterRecord.from_json(record.to_json()).extra == {"zone": "eu"}
    with pytest.raises(MetadataFormatError, match="no instance id"):
        ClusterRecord.from_json(b'{"format":1}')


@pytest.mark.timeout(60)
def test_a_bookie_without_a_metadata_service_warns(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AIOBK_METADATA"}
    process = subprocess.Popen(
        [sys.executable, "-m", "aiobk", "bookie", "start", "--data-dir", str(tmp_path / "b"),
         "--port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=env,
    )  # fmt: skip
    assert process.stderr is not None
    try:
        lines = []
        for line in process.stderr:  # bounded by the test's timeout
            lines.append(line)
            if "serving on" in line:
                break
        warned = [line for line in lines if "no metadata service URI" in line]
        assert len(warned) == 1, lines
        assert "serves unregistered" in warned[0]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        process.stderr.close()
