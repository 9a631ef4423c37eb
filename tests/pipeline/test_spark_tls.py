"""The Spark source on TLS-only bookies that require client certificates (no connection may stay
plaintext silently, the data source's included): tlsCa/tlsCert/tlsKey reach every task; without
them the job fails on the bookies' refusal; bad files fail where the job is planned."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiobk.metadata import EtcdProcess
from aiobk.protocol import BOOKIE, CLIENT
from tests.support.certs import CertAuthority
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tls_cluster(
    etcd_server: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    root = tmp_path_factory.mktemp("spark-tls")
    ca = CertAuthority(root / "certs")
    bookie = ca.issue("bookie", roles=(BOOKIE,))
    client = ca.issue("spark-job", roles=(CLIENT,))
    uri = etcd_server.uri(unique_name("spark-tls"))
    config = root / "bookie.toml"
    config.write_text("".join(f"{k} = {v!r}\n" for k, v in HOST_DISK_SETTINGS.items()))
    procs = [
        BookieProcess(
            root / f"bookie{i}",
            None,
            "--metadata",
            uri,
            "--config",
            str(config),
            "--tls-cert-file",
            str(bookie.cert),
            "--tls-key-file",
            str(bookie.key),
            "--tls-ca-file",
            str(ca.ca_file),
            "--tls-only",
            "--tls-client-auth",
        )
        for i in range(3)
    ]
    try:
        asyncio.run(_start(procs))
        files = {"tlsCa": str(ca.ca_file), "tlsCert": str(client.cert), "tlsKey": str(client.key)}
        yield uri, files
    finally:
        for proc in procs:
            proc.stop()


async def _start(procs: list[BookieProcess]) -> None:
    await asyncio.gather(*(p.start() for p in procs))


def test_a_job_reads_and_writes_through_tls_only_bookies(
    spark: Any, tls_cluster: tuple[str, dict[str, str]]
) -> None:
    uri, files = tls_cluster
    df = spark.createDataFrame([(b"r%d" % i,) for i in range(500)], "data binary").repartition(2)
    writer = df.write.format("aiobk").option("metadata", uri).option("log", "secured")
    for name, value in files.items():
        writer = writer.option(name, value)
    writer.mode("append").save()
    reader = spark.read.format("aiobk").option("metadata", uri).option("log", "secured")
    for name, value in files.items():
        reader = reader.option(name, value)
    assert sorted(bytes(r.data) for r in reader.load().collect()) == sorted(
        b"r%d" % i for i in range(500)
    )
    # Without the options every connection is plaintext, which the bookies refuse: the job
    # fails, nothing is read or written in the clear.
    plain = spark.read.format("aiobk").option("metadata", uri).option("log", "secured")
    with pytest.raises(Exception, match=r"PermissionDenied|plaintext|EPERM|refused"):
        plain.load().collect()
    bad = spark.read.format("aiobk").option("metadata", uri).option("log", "secured")
    with pytest.raises(Exception, match=r"TLS file /nonexistent\.pem does not exist"):
        bad.option("tlsCa", "/nonexistent.pem").load().collect()


def test_tls_files_come_from_the_environment_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from aiobk.pipeline.options import Options

    monkeypatch.setenv("AIOBK_TLS_CA", str(tmp_path / "missing-ca.pem"))
    with pytest.raises(ValueError, match=r"missing-ca\.pem does not exist"):
        Options.parse({"metadata": "etcd://127.0.0.1:1/x", "log": "a"})
    monkeypatch.delenv("AIOBK_TLS_CA")
    assert Options.parse({"metadata": "etcd://127.0.0.1:1/x", "log": "a"}).tls_files == {}
