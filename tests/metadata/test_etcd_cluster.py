"""EtcdCluster: several EtcdProcess members as one etcd cluster on loopback, each
member killed or stopped and started again on its own; a single EtcdProcess unchanged."""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiobk.metadata import EtcdProcess, open_store
from aiobk.metadata.etcd_process import EtcdCluster
from aiobk.metadata.processes import cmdline
from aiobk.metadata.uri import parse_etcd_uri
from tests.support.wait import wait_until_sync

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    started = EtcdCluster(hosts=HOSTS, data_dir=str(tmp_path / "etcd")).start()
    yield started
    started.stop()


def local_revision(member: EtcdProcess, key: bytes) -> int:
    """The revision of ``key``'s last change as ``member`` itself holds it (a serializable
    read: no leader asked), 0 if absent. Over etcd's HTTP gateway, not gRPC: this process's
    gRPC channels share one connection per address, and the one to a member just restarted
    may still be backing off from its refusals while it was down."""
    body = json.dumps({"key": base64.b64encode(key).decode(), "serializable": True}).encode()
    request = urllib.request.Request(
        f"http://{member.endpoint}/v3/kv/range", data=body, method="POST"
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=5.0) as response:
        kvs = json.loads(response.read()).get("kvs", [])
    return int(kvs[0]["mod_revision"]) if kvs else 0


def caught_up(member: EtcdProcess, key: bytes, revision: int) -> None:
    """Until ``member`` holds ``key`` at ``revision`` or later (bounded: 10 s)."""
    wait_until_sync(
        lambda: local_revision(member, key) >= revision,
        timeout=10.0,
        what=f"{member.name} caught up to {revision}",
    )


def member_ids(cluster: EtcdCluster) -> list[str]:
    statuses = [member.status() for member in cluster.running]
    return [status["member_id"] for status in statuses if status is not None]


@pytest.mark.timeout(60)
async def test_the_members_form_one_cluster_with_one_leader(cluster: EtcdCluster) -> None:
    assert [m.host for m in cluster.members] == list(HOSTS)
    assert len(cluster.running) == 3
    assert len(set(member_ids(cluster))) == 3
    leader = cluster.leader()
    assert leader is not None
    statuses = [member.status() for member in cluster.members]
    own = leader.status()
    assert own is not None
    assert {s["leader"] for s in statuses if s is not None} == {own["member_id"]}
    # Every member's command line names all three peers and the cluster's own token.
    for member in cluster.members:
        assert member.pid is not None
        args = cmdline(member.pid)
        assert f"--initial-cluster-token={cluster.token}" in args
        initial = next(a for a in args if a.startswith("--initial-cluster="))
        assert all(m.peer_url in initial for m in cluster.members)
    # The URI names every client endpoint, the one asked for first; each serves the same data.
    uri = cluster.uri("t", first=cluster.members[2])
    assert parse_etcd_uri(uri).endpoints == tuple(
        (m.host, m.client_port) for m in (cluster.members[2], *cluster.members[:2])
    )
    async with open_store(uri) as store:
        ledger_id = await store.allocate_ledger_id()
    for member in cluster.members:
        async with open_store(member.uri("t")) as alone:
            assert await alone.allocate_ledger_id() > ledger_id


@pytest.mark.timeout(60)
async def test_a_killed_leader_is_replaced_and_rejoins_with_what_it_missed(
    cluster: EtcdCluster,
) -> None:
    leader = cluster.leader()
    assert leader is not None
    data_dir = leader.data_dir
    leader.kill()
    assert leader not in cluster.running
    assert leader.process is None
    new_leader = cluster.wait_leader(20)
    assert new_leader is not leader
    assert len(cluster.running) == 2
    # The store, the dead member first in its URI, still takes writes; one happens while down.
    async with open_store(cluster.uri("t", first=leader)) as store:
        missed = await store.allocate_ledger_id()  # an etcd revision
        key = store.keys.idgen
    assert leader.status() is None  # down: it misses the write
    leader.start()  # same ports, same data: it rejoins
    assert leader.running
    assert leader.data_dir == data_dir
    assert len(cluster.running) == 3
    assert len(set(member_ids(cluster))) == 3
    assert cluster.wait_leader(20) in cluster.members
    caught_up(leader, key, missed)


@pytest.mark.timeout(60)
async def test_a_member_stopped_cleanly_starts_again(cluster: EtcdCluster) -> None:
    leader = cluster.leader()
    follower = next(m for m in cluster.members if m is not leader)
    follower.stop(remove_data=False)
    assert len(cluster.running) == 2
    assert cluster.leader() is leader  # losing a follower takes no election
    async with open_store(cluster.uri("t", first=follower)) as store:
        missed = await store.allocate_ledger_id()
        key = store.keys.idgen
    follower.restart()
    assert len(cluster.running) == 3
    caught_up(follower, key, missed)


@pytest.mark.timeout(60)
def test_stop_removes_only_a_directory_of_its_own(tmp_path: Path) -> None:
    own = EtcdCluster(size=3).start()  # on 127.0.0.1, each member on ports of its own
    assert own.data_dir is not None
    assert len({m.endpoint for m in own.members}) == 3
    assert {m.host for m in own.members} == {"127.0.0.1"}
    own.stop()
    assert not os.path.exists(own.data_dir)
    assert own.running == []

    given = tmp_path / "kept"
    with EtcdCluster(size=1, data_dir=str(given)) as single:
        assert single.leader() is single.members[0]
    assert (given / "member0" / "member-data").is_dir()


def test_a_cluster_needs_members_and_one_host_each() -> None:
    with pytest.raises(ValueError, match="at least one member"):
        EtcdCluster(size=0)
    with pytest.raises(ValueError, match="2 hosts given for 3 members"):
        EtcdCluster(size=3, hosts=HOSTS[:2])


@pytest.mark.timeout(60)
def test_a_single_etcd_process_is_still_a_cluster_of_one(tmp_path: Path) -> None:
    """EtcdProcess without the new settings starts as before: itself as the whole initial
    cluster, etcd's default token."""
    server = EtcdProcess(data_dir=str(tmp_path / "e")).start()
    try:
        assert server.pid is not None
        args = cmdline(server.pid)
        assert f"--initial-cluster={server.name}={server.peer_url}" in args
        assert not any(a.startswith("--initial-cluster-token") for a in args)
        status = server.status()
        assert status is not None
        assert status["leader"] == status["member_id"]
        server.kill()
        assert not server.running
        assert server.status() is None
        server.start()  # after a crash, back with its data
        assert server.running
    finally:
        server.stop()
