"""EtcdProcess starts only an etcd of its own: busy ports are refused by name, ready
means the member it started answers (not whichever etcd holds the port), and an etcd left on
its data directory is stopped, or refused while its owner runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from aiobk.metadata import EtcdProcess, etcd_process
from aiobk.metadata.etcd_process import EtcdInUseError, exited, free_port
from aiobk.metadata.etcd_security import EtcdGateway, EtcdGatewayError
from tests.support.wait import wait_until_sync


@pytest.mark.timeout(60)
def test_a_busy_client_port_is_refused_by_name(etcd_server: EtcdProcess, tmp_path: Path) -> None:
    second = EtcdProcess(client_port=etcd_server.client_port, data_dir=str(tmp_path / "e"))
    try:
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{etcd_server.client_port} is in use"):
            second.start()
        assert not second.running
    finally:
        second.stop()


@pytest.mark.timeout(60)
def test_ready_means_our_member_answers_not_the_etcd_on_the_port(
    etcd_server: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the port check cannot close: the ports looked free, the new etcd then failed
    to bind, and the etcd already there answered. Before the fix this "started"."""
    monkeypatch.setattr(etcd_process, "port_in_use", lambda host, port: False)
    second = EtcdProcess(client_port=etcd_server.client_port, data_dir=str(tmp_path / "e"))
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{etcd_server.client_port}"):
            second.start()
        assert time.monotonic() - started < 10
        assert not second.running
    finally:
        second.stop()
    assert etcd_server.running


@pytest.mark.timeout(90)
def test_an_orphaned_etcd_on_the_data_dir_is_stopped_at_start(tmp_path: Path) -> None:
    """An etcd whose parent died (a standalone killed before etcd was tied to it, or one of a
    version that wrote no pid file): started by a shell that exits at once, so that etcd is
    reparented as a real orphan is. Before the fix the next start "succeeded" against it."""
    data_dir = tmp_path / "e"
    client, peer = free_port(), free_port()
    etcd = [
        "etcd", "--name=orphan", "--data-dir=e/member-data",  # relative, as make run's
        f"--listen-client-urls=http://127.0.0.1:{client}",
        f"--advertise-client-urls=http://127.0.0.1:{client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=orphan=http://127.0.0.1:{peer}", "--log-level=error",
    ]  # fmt: skip
    script = 'exec "$@" >/dev/null 2>&1 &\necho $!'
    launched = subprocess.run(
        ["sh", "-c", script, "sh", *etcd],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd=tmp_path,
    )
    orphan = int(launched.stdout.strip())
    try:
        # Until the orphan serves: etcd listens before it bootstraps, and one stopped between
        # the two leaves a member directory with no cluster in it, which no etcd can start
        # from (seen once in CI: the next start waited for a leader that could never exist).
        # A real orphan is an etcd that served its cluster.
        gateway = EtcdGateway(f"127.0.0.1:{client}")

        def serving() -> bool:
            with contextlib.suppress(OSError, ValueError, EtcdGatewayError):
                return bool(gateway.post("/v3/cluster/member/list", {}).get("members"))
            return False

        wait_until_sync(serving, timeout=20, what="the orphan etcd serving its cluster")
        second = EtcdProcess(client_port=client, peer_port=peer, data_dir=str(data_dir))
        second.start()
        try:
            assert exited(orphan)
            assert second.stopped_leftover == orphan
            assert second.running
        finally:
            second.stop()
    finally:
        if not exited(orphan):
            os.kill(orphan, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_a_data_dir_whose_etcd_owner_runs_is_refused(tmp_path: Path) -> None:
    first = EtcdProcess(data_dir=str(tmp_path / "e")).start()
    second = EtcdProcess(data_dir=first.data_dir)  # other ports, same directory
    try:
        assert first.process is not None
        with pytest.raises(EtcdInUseError, match=f"pid {first.process.pid}"):
            second.start()
        assert first.running
    finally:
        second.stop()
        first.stop()
