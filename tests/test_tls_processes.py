"""TLS end to end on real processes: bookie processes started with
``--tls-only --tls-client-auth`` and certificates made here, the CLI with ``--tls-*`` and
``AIOBK_TLS_*``, and autorecovery between the bookies over TLS with their own certificates
(the ``bookie`` role: LEDGER_KEY and recovery adds).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess, MetadataStore, open_store
from aiobk.protocol import ADMIN, BOOKIE, CLIENT
from tests.support.certs import CertAuthority, Issued
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(150)

BOOKIES = 4
ENTRIES = 30
FAST: dict[str, float] = {"registration_ttl": 1.0}
AUTORECOVERY: dict[str, float] = {  # the [autorecovery] table
    "lost_bookie_recovery_delay": 1.0,
    "autorecovery_poll_interval": 0.2,
    "rereplication_retry_delay": 0.2,
    "autorecovery_lease_ttl": 2.0,
}
REPAIR_BOUND = 60.0


class TlsCluster:
    def __init__(self, root: Path, uri: str) -> None:
        self.uri = uri
        self.ca = CertAuthority(root / "certs")
        bookie = self.ca.issue("bookie", roles=(BOOKIE,))
        self.client = self.ca.issue("app", roles=(CLIENT,))
        self.admin = self.ca.issue("operator", roles=(ADMIN,))
        self.procs: dict[str, BookieProcess] = {}
        for i in range(BOOKIES):
            config = root / f"bookie{i}.toml"
            settings = {**HOST_DISK_SETTINGS, **FAST}
            config.write_text(
                "".join(f"{k} = {v!r}\n" for k, v in settings.items())
                + "[autorecovery]\n"
                + "".join(f"{k} = {v!r}\n" for k, v in AUTORECOVERY.items())
            )
            proc = BookieProcess(
                root / f"bookie{i}",
                None,
                "--metadata", uri, "--config", str(config),
                "--tls-cert-file", str(bookie.cert), "--tls-key-file", str(bookie.key),
                "--tls-ca-file", str(self.ca.ca_file), "--tls-only", "--tls-client-auth",
            )  # fmt: skip
            self.procs[f"127.0.0.1:{proc.port}"] = proc

    def context(self, issued: Issued) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.ca_file))
        context.load_cert_chain(*issued.files)
        return context

    def tls_flags(self, issued: Issued) -> list[str]:
        return [
            "--tls-ca", str(self.ca.ca_file), "--tls-cert", str(issued.cert),
            "--tls-key", str(issued.key),
        ]  # fmt: skip

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()


@pytest.fixture
async def cluster(etcd_server: EtcdProcess, tmp_path: Path) -> AsyncIterator[TlsCluster]:
    cluster = TlsCluster(tmp_path, etcd_server.uri(unique_name("tls-procs")))
    try:
        await asyncio.gather(*(p.start() for p in cluster.procs.values()))
        yield cluster
    finally:
        cluster.stop()


def aiobk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiobk", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


async def _wait_not_named(store: MetadataStore, ledger_id: int, victim: str) -> float:
    """Seconds until the ledger's metadata names ``victim`` nowhere."""
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def not_named() -> bool:
        metadata = await store.read_ledger(ledger_id)
        return all(victim not in f.ensemble for f in metadata.fragments)

    await wait_until(
        not_named, timeout=REPAIR_BOUND, every=0.2, what=f"ledger {ledger_id} naming no {victim}"
    )
    return loop.time() - start


async def test_tls_cluster_serves_clients_operators_and_repairs_itself(
    cluster: TlsCluster,
) -> None:
    payloads = [f"entry {i}".encode() for i in range(ENTRIES)]
    async with BookKeeper(cluster.uri, tls=cluster.context(cluster.client)) as bk:
        handle = await bk.create_ledger(3, 3, 2)
        for payload in payloads:
            await handle.append(payload)
        await handle.close()
    ledger_id = handle.ledger_id
    victim = handle.metadata.fragments[0].ensemble[0]
    other = next(b for b in cluster.procs if b != victim)

    # Operators: the admin certificate may run GC; a client certificate is refused with one
    # line; no TLS at all is refused by the tls_only bookie.
    done = aiobk("bookie", "gc", other, *cluster.tls_flags(cluster.admin))
    assert done.returncode == 0, done.stderr
    refused = aiobk("bookie", "gc", other, *cluster.tls_flags(cluster.client))
    assert refused.returncode != 0
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "refused GC" in refused.stderr
    plain = aiobk("bookie", "gc", other)
    assert plain.returncode != 0
    assert plain.stderr.count("\n") == 1, plain.stderr
    assert "TLS" in plain.stderr

    # A client command through AIOBK_TLS_*: reads every entry.
    env = {
        "AIOBK_TLS_CA": str(cluster.ca.ca_file),
        "AIOBK_TLS_CERT": str(cluster.client.cert),
        "AIOBK_TLS_KEY": str(cluster.client.key),
        "AIOBK_METADATA": cluster.uri,
    }
    read = aiobk("ledger", "read", str(ledger_id), env=env)
    assert read.returncode == 0, read.stderr
    assert [line.split("\t", 1)[1] for line in read.stdout.splitlines()] == [
        p.decode() for p in payloads
    ]
    without = aiobk("ledger", "read", str(ledger_id), "--metadata", cluster.uri)
    assert without.returncode != 0

    # A bookie lost for good: the others copy its entries over TLS (bookie certificates).
    cluster.procs.pop(victim).kill()
    store = open_store(cluster.uri)
    try:
        took = await _wait_not_named(store, ledger_id, victim)
    finally:
        await store.close()
    print(f"repaired over TLS in {took:.1f} s")
    async with BookKeeper(cluster.uri, tls=cluster.context(cluster.client)) as bk:
        reader = await bk.open_ledger(ledger_id, recovery=False)
        assert [e.data for e in await reader.read(0, ENTRIES - 1)] == payloads
