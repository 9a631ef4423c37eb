"""The systems ``aiobk bench peers`` compares: each one's servers and its Python client.

Every system is a ``System``: a name, what it replicates and whether it syncs to disk before
it acknowledges, and ``deploy(directory)``, a context manager that starts its servers on
loopback with data under ``directory`` (the project's disk), yields a ``Deployment`` (the
server pids, for their CPU, and a ``PeerClient``), and stops every server on the way out,
also on an error or Ctrl-C. The server binaries are the ones ``make setup`` installs
(``etcd-server``, ``nats-server``, ``redis-server``); each is started so that the kernel kills
it when the benchmark dies, as ``EtcdProcess`` does for etcd.

The clients are each system's own Python asyncio client, used the way its documentation
shows, one append per call:

- aiobk: ``BookKeeper.connect``, ``create_ledger(3, 3, 2, durability=...)``, ``append`` --
  the code path of ``aiobk bench add``; a new ledger per level. ``aiobk-pure`` is the same
  persistent run with ``AIOBK_NO_EXTENSIONS=1`` in a child benchmark process (client and
  bookies on the pure-Python code the compiled modules stand for), closed loop only.
- etcd: aetcd ``put`` of a new key per append (``bench/LEVEL/N``), to the leader.
- NATS JetStream: nats-py ``js.publish`` (it awaits the stream's PubAck) to a file stream with
  three replicas.
- Redis: redis-py asyncio ``XADD`` to one stream per level (its pool opens one connection per
  outstanding command).
"""

from __future__ import annotations

import abc
import asyncio
import importlib.metadata
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass
from typing import Any

import aetcd
import nats
import redis.asyncio as aioredis
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from aiobk.bench.cluster import start_bookies, stop_bookies, stop_processes
from aiobk.bench.loops import Append
from aiobk.client import BookKeeper, ClientConfig, Durability
from aiobk.metadata import EtcdProcess, free_port

# EtcdCluster, and the launcher etcd gets: a child that the kernel kills when this one dies.
from aiobk.metadata.etcd_process import EtcdCluster
from aiobk.metadata.processes import dying_with_parent

STARTUP_TIMEOUT = 30.0  # seconds for a server (a NATS cluster: its JetStream leader) to serve
STREAM_MAX_BYTES = 4 << 30  # NATS stream bound (discard old): a long run cannot fill the disk
SBIN = ("/usr/sbin", "/usr/local/sbin")  # Debian installs nats-server there, off a user's PATH


class PeerClient(abc.ABC):
    """One system's client inside the benchmark process."""

    @abc.abstractmethod
    async def open(self, concurrency: int) -> None:
        """Connect (and create what every level shares: NATS's stream); ``concurrency``:
        the most appends that will be outstanding at once."""

    @abc.abstractmethod
    def target(self, label: str) -> AbstractAsyncContextManager[Append]:
        """What one level appends to (a ledger, a key prefix, a subject, a stream key)."""

    @abc.abstractmethod
    async def close(self) -> None: ...


@dataclass
class Deployment:
    pids: list[int]  # every server process of the system, for its CPU seconds
    client: PeerClient


@dataclass(frozen=True)
class System:
    key: str  # its name in --systems and in the JSON
    title: str
    replicated: str
    fsync: str  # does an acknowledged append wait for a disk sync?
    deploy: Callable[[str], AbstractContextManager[Deployment]]
    # Measured by a child ``aiobk bench peers`` run on this system's deployment with these
    # environment variables, its figures taken as this system's: for what is chosen at import
    # (``AIOBK_NO_EXTENSIONS``), which this process has already chosen.
    child_env: tuple[tuple[str, str], ...] = ()


# ---------------------------------------------------------------------- server processes


def binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))
    if found is None:
        raise RuntimeError(f"{name} is not installed; `make setup` installs it with apt")
    return found


def version(command: Sequence[str]) -> str:
    """The first line a server prints for its version flag ('' when it cannot)."""
    try:
        done = subprocess.run(
            [binary(command[0]), *command[1:]],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        return ""
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else ""


def launch(command: list[str], log_path: str) -> subprocess.Popen[bytes]:
    """A server in its own session (a terminal's Ctrl-C reaches the benchmark, which stops it),
    output to ``log_path``, killed by the kernel if the benchmark dies first."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            dying_with_parent(command),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def wait_listening(proc: subprocess.Popen[bytes], port: int, log_path: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {STARTUP_TIMEOUT} s; see {log_path}")


# ---------------------------------------------------------------------- aiobk


class AiobkClient(PeerClient):
    def __init__(self, uri: str, durability: Durability) -> None:
        self.uri = uri
        self.durability = durability
        self.bk: BookKeeper | None = None

    async def open(self, concurrency: int) -> None:
        self.bk = await BookKeeper.connect(self.uri, ClientConfig())

    @asynccontextmanager
    async def target(self, label: str) -> AsyncIterator[Append]:
        assert self.bk is not None
        ledger = await self.bk.create_ledger(3, 3, 2, durability=self.durability)
        try:
            yield ledger.append
        finally:
            await ledger.close()

    async def close(self) -> None:
        if self.bk is not None:
            await self.bk.close()


@contextmanager
def aiobk_deployment(durability: Durability, directory: str) -> Iterator[Deployment]:
    """etcd for the metadata and three bookie processes, as ``aiobk bench add`` runs them."""
    etcd = EtcdProcess(data_dir=os.path.join(directory, "etcd")).start()
    try:
        uri = etcd.uri("bench")
        bookies = start_bookies(3, directory, uri)
        try:
            assert etcd.pid is not None
            yield Deployment([etcd.pid, *(b.pid for b in bookies)], AiobkClient(uri, durability))
        finally:
            stop_bookies(bookies)
    finally:
        etcd.stop()


# ---------------------------------------------------------------------- etcd


class EtcdClient(PeerClient):
    def __init__(self, endpoint: str) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.client = aetcd.Client(host=host, port=int(port))

    async def open(self, concurrency: int) -> None:
        await self.client.connect()

    @asynccontextmanager
    async def target(self, label: str) -> AsyncIterator[Append]:
        count = 0

        async def put(payload: bytes) -> None:
            nonlocal count
            count += 1
            await self.client.put(f"bench/{label}/{count:010d}".encode(), payload)

        yield put

    async def close(self) -> None:
        await self.client.close()


@contextmanager
def etcd_deployment(members: int, directory: str) -> Iterator[Deployment]:
    """An etcd of ``members`` members; the client talks to the leader (a follower would
    forward every put to it: one more hop)."""
    cluster = EtcdCluster(size=members, data_dir=directory).start()
    try:
        leader = cluster.wait_leader()
        pids = [member.pid for member in cluster.members if member.pid is not None]
        yield Deployment(pids, EtcdClient(leader.endpoint))
    finally:
        cluster.stop()


# ---------------------------------------------------------------------- NATS JetStream

NATS_CONFIG = """server_name: {name}
listen: 127.0.0.1:{port}
jetstream {{ store_dir: "{store}" }}
cluster {{
  name: aiobk-bench
  listen: 127.0.0.1:{route_port}
  routes: [{routes}]
}}
"""


class NatsClient(PeerClient):
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.nc: Any = None
        self.js: Any = None

    async def open(self, concurrency: int) -> None:
        self.nc = await nats.connect(self.urls, dont_randomize=True, connect_timeout=5)
        self.js = self.nc.jetstream()
        config = StreamConfig(
            name="BENCH", subjects=["bench.>"], storage=StorageType.FILE, num_replicas=3,
            max_bytes=STREAM_MAX_BYTES, discard=DiscardPolicy.OLD,
        )  # fmt: skip
        # The stream can be made once the cluster has a JetStream meta leader.
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            try:
                await self.js.add_stream(config)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    @asynccontextmanager
    async def target(self, label: str) -> AsyncIterator[Append]:
        subject = f"bench.{label}"

        async def publish(payload: bytes) -> None:
            await self.js.publish(subject, payload, timeout=30)

        yield publish

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


@contextmanager
def nats_deployment(directory: str, size: int = 3) -> Iterator[Deployment]:
    """``size`` nats-server processes forming one JetStream cluster."""
    ports = [free_port() for _ in range(size)]
    route_ports = [free_port() for _ in range(size)]
    routes = ", ".join(f"nats-route://127.0.0.1:{port}" for port in route_ports)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(size):
            home = os.path.join(directory, f"nats{index}")
            os.makedirs(home, exist_ok=True)
            config = os.path.join(home, "nats.conf")
            with open(config, "w") as handle:
                handle.write(NATS_CONFIG.format(
                    name=f"n{index}", port=ports[index], store=os.path.join(home, "jetstream"),
                    route_port=route_ports[index], routes=routes,
                ))  # fmt: skip
            log = os.path.join(home, "nats.log")
            procs.append(launch([binary("nats-server"), "-c", config], log))
        for index, proc in enumerate(procs):
            wait_listening(proc, ports[index], os.path.join(directory, f"nats{index}", "nats.log"))
        urls = [f"nats://127.0.0.1:{port}" for port in ports]
        yield Deployment([proc.pid for proc in procs], NatsClient(urls))
    finally:
        stop_processes(procs)


# ---------------------------------------------------------------------- Redis


class RedisClient(PeerClient):
    def __init__(self, port: int) -> None:
        self.port = port
        self.client: aioredis.Redis | None = None

    async def open(self, concurrency: int) -> None:
        # redis-py runs one command per connection; its pool's default cap (100) fails the
        # 101st outstanding command with MaxConnectionsError, so the pool gets one per append.
        pool = aioredis.ConnectionPool(host="127.0.0.1", port=self.port,
                                       max_connections=concurrency)  # fmt: skip
        self.client = aioredis.Redis(connection_pool=pool)
        await self.client.ping()

    @asynccontextmanager
    async def target(self, label: str) -> AsyncIterator[Append]:
        key = f"bench:{label}"
        client = self.client
        assert client is not None

        async def xadd(payload: bytes) -> None:
            await client.xadd(key, {"d": payload})

        yield xadd

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose(close_connection_pool=True)


@contextmanager
def redis_deployment(directory: str) -> Iterator[Deployment]:
    """One redis-server, every write in its append-only file, fsynced before the reply."""
    os.makedirs(directory, exist_ok=True)
    port = free_port()
    log = os.path.join(directory, "redis.log")
    command = [
        binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
        "--dir", directory, "--appendonly", "yes", "--appendfsync", "always",
        "--save", "", "--daemonize", "no", "--logfile", log,
    ]  # fmt: skip
    proc = launch(command, log)
    try:
        wait_listening(proc, port, log)
        yield Deployment([proc.pid], RedisClient(port))
    finally:
        stop_processes([proc])


# ---------------------------------------------------------------------- the list


def _aiobk(durability: Durability) -> Callable[[str], AbstractContextManager[Deployment]]:
    return lambda directory: aiobk_deployment(durability, directory)


def _etcd(members: int) -> Callable[[str], AbstractContextManager[Deployment]]:
    return lambda directory: etcd_deployment(members, directory)


# aiobk persistent with the compiled modules left out, client and bookies: the compiled hot
# path's CPU is judged against it, in the same run.
PURE = "aiobk-pure"

# NATS first: an open-loop rate given as a share of NATS's maximum needs that maximum.
SYSTEMS = (
    System("nats", "NATS JetStream R3 file (nats-py)", "3 servers", "no", nats_deployment),
    System(
        "aiobk-persistent",
        "aiobk persistent E3 WQ3 AQ2",
        "3 bookies",
        "yes (2 of 3)",
        _aiobk(Durability.PERSISTENT),
    ),
    System(
        PURE,
        "aiobk persistent, pure Python (AIOBK_NO_EXTENSIONS=1)",
        "3 bookies",
        "yes (2 of 3)",
        _aiobk(Durability.PERSISTENT),
        child_env=(("AIOBK_NO_EXTENSIONS", "1"),),
    ),
    System(
        "aiobk-volatile",
        "aiobk volatile (BP-14)",
        "3 bookies",
        "no",
        _aiobk(Durability.VOLATILE),
    ),
    System("etcd-3", "etcd 3 members (aetcd)", "3 members", "yes (majority)", _etcd(3)),
    System("etcd-1", "etcd 1 member (aetcd)", "no", "yes", _etcd(1)),
    System("redis", "Redis AOF always (redis-py)", "no", "yes", redis_deployment),
)
SYSTEM_KEYS = tuple(system.key for system in SYSTEMS)


# The clients' versions matter as much as the servers': a client's CPU per operation is much of
# a peer's cost on this machine, and `make setup` installs the newest release the `bench` extra
# allows (see bench/README.md).
CLIENT_PACKAGES = ("nats-py", "redis", "aetcd", "uvloop")


def versions() -> dict[str, str]:
    found = {
        "etcd": version(["etcd", "--version"]),
        "nats-server": version(["nats-server", "--version"]),
        "redis-server": version(["redis-server", "--version"]),
    }
    for package in CLIENT_PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found
