"""The bookie's HTTP admin API (``aiobk.http_admin``): real bookies on a real etcd,
every endpoint over loopback with aiohttp's client, every bad input, etcd paused, the
autorecovery endpoints against what ``aiobk autorecovery ... --json`` prints, and the
``aiobk bookie start --http-port`` process (the port is off without it, on the bookie's host
unless ``--http-host`` says otherwise)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aiobk.bookie import BookieConfig
from aiobk.bookie.write_state import DISK
from aiobk.client import BookKeeper, LedgerHandle
from aiobk.client.errors import NotEnoughBookiesError
from aiobk.http_admin import HttpAdmin
from aiobk.metadata import EtcdProcess, MetadataStore, free_port, open_store
from aiobk.runner import make_bookie, start_http_admin
from tests.autorecovery.test_status import seed
from tests.support.cluster import Cluster, start_cluster
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS, BookieProcess, stopped
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(30)

QUIET = {"gc_interval": 0, "autorecovery_enabled": False}


class Http:
    """One client session against one bookie's admin API."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def call(
        self, method: str, path: str, body: str | bytes | None = None
    ) -> tuple[int, Any, Mapping[str, str]]:
        """(status, the JSON document or the text, headers)."""
        async with self.session.request(method, self.url + path, data=body) as response:
            text = await response.text()
            if response.content_type == "application/json":
                return response.status, json.loads(text), response.headers
            return response.status, text, response.headers

    async def json(self, method: str, path: str, body: str | None = None) -> tuple[int, Any]:
        status, document, headers = await self.call(method, path, body)
        assert headers["Content-Type"].startswith("application/json"), (path, document)
        return status, document

    async def close(self) -> None:
        await self.session.close()


@pytest.fixture
async def admin(
    etcd_server: EtcdProcess, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, Http, HttpAdmin]]:
    """One bookie on etcd (autorecovery beside it, as by default) with its HTTP API."""
    cluster = await start_cluster(tmp_path, 0, uri=etcd_server.uri(unique_name("http")))
    bookie = await cluster.add_bookie(http_port=0, gc_interval=0)
    http_admin = await start_http_admin(bookie)
    assert http_admin is not None
    client = Http(http_admin.url)
    try:
        yield cluster, client, http_admin
    finally:
        await client.close()
        await http_admin.stop()
        await cluster.stop()


def expect_error(status: int, document: Any, wanted: int, *words: str) -> None:
    assert status == wanted, document
    assert isinstance(document, dict), document
    assert isinstance(document["error"], str)
    assert "\n" not in document["error"]
    for word in words:
        assert word in document["error"], document


async def test_every_endpoint_answers(admin: tuple[Cluster, Http, HttpAdmin]) -> None:
    cluster, http, http_admin = admin
    bookie = cluster.bookies[0]
    status, text, _headers = await http.call("GET", "/heartbeat")
    assert (status, text) == (200, "OK\n")

    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(1, 1, 1, password=b"pw")
        for i in range(3):
            await lh.append(b"entry %d" % i)
        await lh.close()
        doomed = await bk.create_ledger(1, 1, 1)
        await doomed.append(b"x")
        await doomed.close()

    status, text, headers = await http.call("GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert f'aiobk_bookie_adds_total{{bookie="{bookie.bookie_id}"}} 4.0' in text
    assert f'aiobk_bookie_writable{{bookie="{bookie.bookie_id}"}} 1.0' in text
    labels = f'bookie="{bookie.bookie_id}",node="{bookie.bookie_id}"'
    assert f"aiobk_autorecovery_ledgers_repaired_total{{{labels}}}" in text
    assert "python_info" in text  # the process's registry follows the bookie's figures

    status, info = await http.json("GET", "/api/v1/bookie/info")
    assert status == 200
    assert info["id"] == info["address"] == bookie.bookie_id
    assert (info["state"], info["readOnly"], info["reasons"]) == ("writable", False, [])
    assert info["version"]
    assert info["directories"]["data"] == bookie.config.data_dir
    assert info["directories"]["journal"] == bookie.config.journal_path
    assert [u["directory"] for u in info["disk_usage"]] == ["data", "journal"]
    for usage in info["disk_usage"]:
        assert 0 < usage["free"] <= usage["total"]
        assert 0 <= usage["used"] <= 1
    assert info["ledgers_held"] == 2
    assert info["figures"]["adds"] == 4
    assert info["registered"] is True
    assert info["metadata"] == cluster.uri

    status, state = await http.json("GET", "/api/v1/bookie/state")
    assert status == 200
    assert state == {
        "id": bookie.bookie_id,
        "state": "writable",
        "readOnly": False,
        "reasons": [],
        "high_priority_writes": True,
        "checkpoint_error": None,
        "running": True,
    }

    status, found = await http.json("GET", f"/api/v1/ledger/metadata?ledger_id={lh.ledger_id}")
    assert status == 200
    assert found["ledger_id"] == lh.ledger_id
    assert (found["state"], found["last_entry_id"]) == ("CLOSED", 2)
    assert found["fragments"] == [{"first_entry_id": 0, "ensemble": [bookie.bookie_id]}]
    assert isinstance(found["version"], int)
    assert "password_digest" not in found
    status, missing = await http.json("GET", "/api/v1/ledger/metadata?ledger_id=999999999")
    expect_error(status, missing, 404, "999999999")

    # GC: the deleted ledger goes, and the details say so.
    async with await BookKeeper.connect(cluster.uri) as bk:
        await bk.delete_ledger(doomed.ledger_id)
    status, gc = await http.json("PUT", "/api/v1/bookie/gc")
    assert status == 200, gc
    assert (gc["ledgers_deleted"], gc["skipped"]) == (1, None)
    assert {"logs_removed", "logs_compacted", "entries_moved", "bytes_freed", "duration"} <= set(gc)
    status, details = await http.json("GET", "/api/v1/bookie/gc_details")
    assert status == 200
    assert (details["running"], details["periodic"]) == (False, False)  # gc_interval 0
    assert details["last_requested_pass"] == gc
    assert details["totals"]["gc_ledgers_deleted"] == 1
    status, info = await http.json("GET", "/api/v1/bookie/info")
    assert info["ledgers_held"] == 1
    # A pass that outlasts the wait goes on in the background (202); one at a time (409).
    http_admin.gc_wait = 0.0
    status, running = await http.json("PUT", "/api/v1/bookie/gc")
    assert (status, running["running"]) == (202, True)
    status, document = await http.json("PUT", "/api/v1/bookie/gc")
    expect_error(status, document, 409, "running")

    async def ended() -> bool:
        return not (await http.json("GET", "/api/v1/bookie/gc_details"))[1]["running"]

    await wait_until(ended, every=0.01, timeout=10, what="the GC pass ended")
    status, details = await http.json("GET", "/api/v1/bookie/gc_details")
    assert details["last_requested_pass"]["ledgers_deleted"] == 0
    assert details["last_requested_pass"]["started"] == running["started"]

    # Autorecovery, as `aiobk autorecovery status --json` and `list-underreplicated`.
    store = open_store(cluster.uri)
    try:
        await store.autorecovery.set_enabled(False)  # no worker takes the mark made below
        status, report = await http.json("GET", "/api/v1/autorecovery/status")
        assert status == 200
        assert (report["enabled"], report["under_replicated_ledgers"]) == (False, 0)
        assert {"auditor", "lost_bookies", "lost_ledgers", "decommissioning"} <= set(report)
        status, listed = await http.json("GET", "/api/v1/autorecovery/list_under_replicated_ledger")
        assert (status, listed) == (200, {"ledgers": [], "marks": []})
        await store.autorecovery.mark(lh.ledger_id, ["gone:1"], "test", int(time.time() * 1000))
        status, listed = await http.json("GET", "/api/v1/autorecovery/list_under_replicated_ledger")
        assert status == 200
        assert listed["ledgers"] == [lh.ledger_id]
        assert listed["marks"][0]["missing"] == ["gone:1"]
        assert listed["marks"][0]["reasons"] == ["test"]
        status, report = await http.json("GET", "/api/v1/autorecovery/status")
        assert report["under_replicated_ledgers"] == 1
    finally:
        await store.close()


async def test_bad_input_gets_a_clear_4xx(admin: tuple[Cluster, Http, HttpAdmin]) -> None:
    _cluster, http, _http_admin = admin
    metadata = "/api/v1/ledger/metadata"
    for query, words in [
        ("", ("required",)),
        ("?ledgerid=1", ("required",)),
        ("?ledger_id=", ("integer",)),
        ("?ledger_id=abc", ("integer", "'abc'")),
        ("?ledger_id=-1", ("integer",)),
        ("?ledger_id=1.5", ("integer",)),
        ("?ledger_id=%2B5", ("integer",)),
        ("?ledger_id=9223372036854775808", ("integer",)),
        ("?ledger_id=1&ledger_id=2", ("once",)),
    ]:
        status, document = await http.json("GET", metadata + query)
        expect_error(status, document, 400, *words)

    state = "/api/v1/bookie/state"
    for body, words in [
        ("{not json", ("JSON",)),
        ("[true]", ("object",)),
        ('"readOnly"', ("object",)),
        ("{}", ("readOnly",)),
        ('{"readOnly": "yes"}', ("readOnly",)),
        ('{"readOnly": 1}', ("readOnly",)),
        ('{"readOnly": true, "force": true}', ("force",)),
        (b"\xff\xfe", ("JSON",)),
    ]:
        status, document = await http.json("PUT", state, body)  # type: ignore[arg-type]
        expect_error(status, document, 400, *words)
    status, document = await http.json("PUT", state)  # no body at all
    expect_error(status, document, 400, "readOnly")
    status, document = await http.json("PUT", state, '{"readOnly": false}' + " " * 5000)
    expect_error(status, document, 413, "4096")
    for body in ("{", '{"isMajor": true}'):
        status, document = await http.json("PUT", "/api/v1/bookie/gc", body)
        expect_error(status, document, 400)

    for method, path in [
        ("POST", state),
        ("DELETE", "/heartbeat"),
        ("GET", "/api/v1/bookie/gc"),
        ("PUT", "/api/v1/bookie/info"),
        ("POST", metadata + "?ledger_id=1"),
    ]:
        status, document, headers = await http.call(method, path)
        expect_error(status, document, 405, method, path.partition("?")[0])
        assert headers["Allow"]
    for path in ["/", "/nope", "/api/v1/bookie/info/", "/api/v1/bookie", "/api/v2/bookie/info"]:
        status, document = await http.json("GET", path)
        expect_error(status, document, 404, path)

    # None of it changed anything.
    status, document = await http.json("GET", state)
    assert (status, document["state"]) == (200, "writable")


async def test_read_only_round_trip_moves_a_writer(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """PUT read-only: the writer's next add is refused there and it changes its ensemble; PUT
    writable: the bookie takes adds again."""
    cluster = await start_cluster(tmp_path, 3, uri=etcd_server.uri(unique_name("http")), **QUIET)
    admins: list[HttpAdmin] = []
    try:
        async with await BookKeeper.connect(cluster.uri) as bk:
            lh = await bk.create_ledger(2, 2, 2)
            await lh.append(b"before")
            member = cluster.by_id(lh.metadata.ensemble[0])
            assert await start_http_admin(member) is None  # http_port unset: no API
            http_admin = HttpAdmin(member, "127.0.0.1", 0)
            admins.append(http_admin)
            await http_admin.start()
            http = Http(http_admin.url)
            try:
                status, state = await http.json("PUT", "/api/v1/bookie/state", '{"readOnly": true}')
                assert status == 200, state
                assert (state["state"], state["readOnly"]) == ("readonly", True)
                assert state["reasons"] == ["operator: set read-only by an operator"]
                assert (await http.json("GET", "/api/v1/bookie/state"))[1] == state

                await lh.append(b"after")  # EREADONLY there, then a new ensemble
                assert member.bookie_id not in lh.metadata.ensemble
                assert member.stats.adds_refused_read_only >= 1
                await lh.close()
                rh = await bk.open_ledger(lh.ledger_id, recovery=False)
                assert [e.data for e in await rh.read(0, 1)] == [b"before", b"after"]

                status, state = await http.json(
                    "PUT", "/api/v1/bookie/state", '{"readOnly": false}'
                )
                assert (status, state["state"], state["reasons"]) == (200, "writable", [])
                assert member.write_state.writable
                created: list[LedgerHandle] = []

                async def placed() -> bool:  # once the registry says writable again
                    try:
                        created.append(await bk.create_ledger(3, 3, 3))  # this bookie included
                    except NotEnoughBookiesError:
                        return False
                    return True

                await wait_until(placed, timeout=10, what="a ledger on every bookie")
                again = created[-1]
                await again.append(b"writable again")
                assert member.bookie_id in again.metadata.ensemble
            finally:
                await http.close()
    finally:
        for http_admin in admins:
            await http_admin.stop()
        await cluster.stop()


async def test_without_a_metadata_store(tmp_path: Path) -> None:
    """The bookie endpoints answer; those that need the store say it has none (503). Bound to
    ``http_host`` when given. A writable PUT that a full disk overrules is a 409."""
    config = BookieConfig(
        data_dir=str(tmp_path / "b"),
        port=0,
        http_port=0,
        http_host="127.0.0.2",
        **HOST_DISK_SETTINGS,
    )
    bookie = make_bookie(config)
    await bookie.start()
    http_admin = await start_http_admin(bookie)
    assert http_admin is not None
    assert http_admin.host == "127.0.0.2"
    http = Http(http_admin.url)
    try:
        assert (await http.call("GET", "/heartbeat"))[:2] == (200, "OK\n")
        status, text, _headers = await http.call("GET", "/metrics")
        assert status == 200
        assert f'bookie="{bookie.bookie_id}"' in text
        status, info = await http.json("GET", "/api/v1/bookie/info")
        assert status == 200
        assert (info["registered"], info["metadata"], info["state"]) == (False, None, "writable")
        status, details = await http.json("GET", "/api/v1/bookie/gc_details")
        assert (status, details["periodic"], details["last_requested_pass"]) == (200, False, None)
        for method, path in [
            ("PUT", "/api/v1/bookie/gc"),
            ("GET", "/api/v1/autorecovery/status"),
            ("GET", "/api/v1/autorecovery/list_under_replicated_ledger"),
            ("GET", "/api/v1/ledger/metadata?ledger_id=1"),
        ]:
            status, document = await http.json(method, path)
            expect_error(status, document, 503, "without a metadata store")
        status, document = await http.json("GET", "/api/v1/ledger/metadata?ledger_id=x")
        expect_error(status, document, 400)  # bad input is still bad input

        taken = HttpAdmin(bookie, http_admin.host, http_admin.port)
        with pytest.raises(OSError, match=r"HTTP admin API on 127\.0\.0\.2:.*in use"):
            await taken.start()

        bookie.write_state.set(DISK, "test: the disk is full")
        status, document = await http.json("PUT", "/api/v1/bookie/state", '{"readOnly": false}')
        expect_error(status, document, 409, "stays read-only", "the disk is full")
        assert document["state"] == "readonly"
        bookie.write_state.clear(DISK)
        status, document = await http.json("GET", "/api/v1/bookie/state")
        assert document["state"] == "writable"
    finally:
        await http.close()
        await http_admin.stop()
        await bookie.stop()


@pytest.fixture
def own_etcd() -> Iterator[EtcdProcess]:
    """An etcd of this test's own, to pause without disturbing the session's."""
    server = EtcdProcess().start()
    yield server
    if server.pid is not None:
        os.kill(server.pid, signal.SIGCONT)
    server.stop()


async def test_etcd_unreachable_is_503_within_the_timeout(
    own_etcd: EtcdProcess, tmp_path: Path
) -> None:
    cluster = await start_cluster(tmp_path, 0, uri=own_etcd.uri(unique_name("http")), **QUIET)
    bookie = await cluster.add_bookie(http_port=0)
    http_admin = await start_http_admin(bookie, store_timeout=1.0)
    assert http_admin is not None
    http = Http(http_admin.url)
    try:
        metadata = "/api/v1/ledger/metadata?ledger_id=7"
        status, document = await http.json("GET", metadata)
        expect_error(status, document, 404, "7")
        assert own_etcd.pid is not None
        os.kill(own_etcd.pid, signal.SIGSTOP)
        await stopped(own_etcd.pid)
        started = time.monotonic()
        answers = await asyncio.gather(*(http.json("GET", metadata) for _ in range(5)))
        assert time.monotonic() - started < 5.0
        assert sorted(status for status, _document in answers) == [429, 503, 503, 503, 503]
        for status, document in answers:
            if status == 503:
                expect_error(status, document, 503, "did not answer within 1s")
        status, document = await http.json("GET", "/api/v1/autorecovery/status")
        expect_error(status, document, 503, "metadata store")
        assert (await http.call("GET", "/heartbeat"))[:2] == (200, "OK\n")  # the bookie serves
        status, _info = await http.json("GET", "/api/v1/bookie/info")
        assert status == 200
        os.kill(own_etcd.pid, signal.SIGCONT)
        status, document = await http.json("GET", metadata)
        expect_error(status, document, 404, "7")
    finally:
        await http.close()
        await http_admin.stop()
        await cluster.stop()


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its socket inodes in /proc/net/tcp*)."""
    return {port for _address, port in listening_addresses(pid)}


def _proc_address(text: str) -> str:
    """An address of /proc/net/tcp*: hex, each 32-bit word in host (little-endian) order."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    address, port = fields[1].rsplit(":", 1)
                    found.add((_proc_address(address), int(port, 16)))
    return found


async def test_bookie_process_serves_http_only_when_asked(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    uri = etcd_server.uri(unique_name("http"))
    http_port = free_port()
    settings = ("--metadata", uri, "--config", str(tmp_path / "bookie.toml"))
    toml = [f"{k} = {v}" for k, v in HOST_DISK_SETTINGS.items()]
    (tmp_path / "bookie.toml").write_text(
        "\n".join([*toml, "gc_interval = 0", "autorecovery_enabled = false", ""])
    )
    with_http = BookieProcess(tmp_path / "a", None, *settings, "--http-port", str(http_port))
    without = BookieProcess(tmp_path / "b", None, *settings)
    try:
        await asyncio.gather(with_http.start(), without.start())
        assert with_http.process is not None
        assert without.process is not None
        assert listening_ports(with_http.process.pid) == {with_http.port, http_port}
        assert listening_ports(without.process.pid) == {without.port}
        http = Http(f"http://127.0.0.1:{http_port}")
        try:
            assert (await http.call("GET", "/heartbeat"))[:2] == (200, "OK\n")
            status, info = await http.json("GET", "/api/v1/bookie/info")
            assert (status, info["id"]) == (200, f"127.0.0.1:{with_http.port}")
            status, state = await http.json("PUT", "/api/v1/bookie/state", '{"readOnly": true}')
            assert (status, state["state"]) == (200, "readonly")
            store: MetadataStore = open_store(uri)
            try:

                async def read_only() -> bool:  # at once (placement reads the registry)
                    writable = await store.list_bookies(writable_only=True)
                    return [b.bookie_id for b in writable] == [f"127.0.0.1:{without.port}"]

                await wait_until(read_only, timeout=10, what="registered read-only")
            finally:
                await store.close()
        finally:
            await http.close()
        assert await asyncio.to_thread(with_http.terminate) == 0  # the API stops with it
    finally:
        with_http.stop()
        without.stop()


async def test_the_api_listens_on_the_bookies_host_unless_told(tmp_path: Path) -> None:
    """A bookie started with ``--host 127.0.0.3`` and no ``--http-host`` serves the API on
    127.0.0.3 alone: not on 127.0.0.1, nor on every interface."""
    host = "127.0.0.3"
    http_port = free_port(host)
    proc = BookieProcess(
        tmp_path / "b", free_port(host), "--host", host, "--http-port", str(http_port)
    )
    try:
        await proc.start()
        assert proc.process is not None
        assert listening_addresses(proc.process.pid) == {(host, proc.port), (host, http_port)}
        http = Http(f"http://{host}:{http_port}")
        try:
            assert (await http.call("GET", "/heartbeat"))[:2] == (200, "OK\n")
            status, info = await http.json("GET", "/api/v1/bookie/info")
            assert (status, info["id"]) == (200, f"{host}:{proc.port}")
        finally:
            await http.close()
        for elsewhere in ("127.0.0.1", "0.0.0.0"):  # dialled: nothing of this bookie's there
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection(elsewhere, http_port)
        assert await asyncio.to_thread(proc.terminate) == 0
    finally:
        proc.stop()


CLI_ENV = {k: v for k, v in os.environ.items() if k != "AIOBK_METADATA"}


async def cli_json(*args: str) -> Any:
    """What ``aiobk ARGS --json`` prints, parsed (a child process, as an operator runs it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiobk", *args, "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=CLI_ENV,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_autorecovery_endpoints_answer_what_the_cli_prints(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """For one cluster state -- empty, then marks of every kind, an elected auditor's status, a
    bookie draining and autorecovery off (``seed``) -- ``/api/v1/autorecovery/status`` is
    ``aiobk autorecovery status --json`` and ``list_under_replicated_ledger``'s ids are
    ``aiobk autorecovery list-underreplicated --json``, each mark as the store holds it."""
    uri = etcd_server.uri(unique_name("http"))
    cluster = await start_cluster(tmp_path, 0, uri=uri, **QUIET)  # no auditor of its own
    bookie = await cluster.add_bookie(http_port=0)
    http_admin = await start_http_admin(bookie)
    assert http_admin is not None
    http = Http(http_admin.url)
    store = open_store(uri)
    lease = None
    try:
        for seeded in (False, True):
            if seeded:
                lease = await seed(store)
            status, report = await http.json("GET", "/api/v1/autorecovery/status")
            assert status == 200, report
            assert report == await cli_json("autorecovery", "status", "--metadata", uri)
            status, listed = await http.json(
                "GET", "/api/v1/autorecovery/list_under_replicated_ledger"
            )
            assert status == 200, listed
            ids = await cli_json("autorecovery", "list-underreplicated", "--metadata", uri)
            assert listed["ledgers"] == ids
            assert [mark["ledger_id"] for mark in listed["marks"]] == ids
            for mark in listed["marks"]:
                held = await store.autorecovery.read_mark(mark["ledger_id"])
                assert held is not None
                assert mark == {
                    "ledger_id": held.ledger_id,
                    "missing": list(held.missing),
                    "since": held.since,
                    "reasons": list(held.reasons),
                    "lost": [list(r) for r in held.lost],
                }
            if seeded:  # the comparison was of something
                assert ids == [10, 11, 13]
                assert (report["auditor"], report["enabled"]) == ("auditor-1", False)
                assert report["under_replicated_ledgers"] == 3
                assert report["lost_ledger_count"] == 2
                assert report["decommissioning"] == ["b3:3"]
            else:
                assert (ids, report["under_replicated_ledgers"]) == ([], 0)
    finally:
        if lease is not None:
            await lease.close()
        await store.close()
        await http.close()
        await http_admin.stop()
        await cluster.stop()
