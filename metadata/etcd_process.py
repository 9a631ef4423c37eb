"""Run a real etcd server as a child process (standalone clusters and tests).

Loopback only; a temporary or given data directory; stopped with SIGTERM, then SIGKILL.
``stop(remove_data=False)`` then ``start()`` (or ``restart()``) brings the same member back on the
same ports with its data: an etcd outage for tests, as a restart or crash of the real one.

An etcd started here is this process's alone, and never outlives it:

- Before launching, both ports must be free (``EtcdPortInUseError`` names the one that is not).
- Ready means the etcd answering on the client port is the member started here: it has a
  unique member name, checked through the member list. Accepting connections is not enough:
  when its ports were taken, etcd exits on ``bind: address already in use`` while the etcd
  that holds them answers (a second standalone said "ready" that way and its bookies
  registered in the first one's cluster).
- On Linux it is killed when the thread that launched it dies (``PR_SET_PDEATHSIG``), so a
  ``kill -9`` of this process takes etcd with it (launched from the main thread, that is the
  process). It runs in its own session: a Ctrl-C in a terminal reaches this process, which
  stops its bookies while etcd is still up, then etcd.
- ``etcd.pid`` in the data directory names the etcd and its owner. A start finds an etcd a
  dead owner left running on the directory (one launched from a thread other than the main
  one, or by a version without the parent-death signal; on Linux also by its command line)
  and stops it; one whose owner still runs is refused (``EtcdInUseError``).

With ``tls`` (an ``EtcdServerTLS``) the client port speaks only TLS (``https``, ``etcds://``
in ``uri()``), optionally requiring client certificates; ``gateway.enable_auth`` turns
on etcd's auth with a root user, and ``gateway.add_user`` adds users limited to a key prefix
(``metadata.etcd_security``).

``EtcdCluster`` runs several members as one cluster (a 3-member etcd for the multi-host test,
``tests/test_multi_host.py``), each an ``EtcdProcess`` with the rules above; ``kill()`` one
(SIGKILL) and ``start()`` it again to lose a member and bring it back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiobk.metadata.etcd_security import EtcdGateway, EtcdGatewayError, EtcdServerTLS
from aiobk.metadata.processes import (
    alive,
    cmdline,
    dying_with_parent,
    exited,
    free_port,
    pids,
    port_in_use,
    proc_state,
    wait_gone,
)

__all__ = [
    "AUTO_COMPACTION",
    "PIDFILE",
    "EtcdCluster",
    "EtcdInUseError",
    "EtcdNotFoundError",
    "EtcdPortInUseError",
    "EtcdProcess",
    "exited",
    "free_port",
    "port_in_use",
]

log = logging.getLogger(__name__)

PIDFILE = "etcd.pid"


# etcd's own bound on its history: revision-mode auto-compaction keeping this many revisions
# (what `aiobk standalone` runs with; the bookies' GC passes compact too).
AUTO_COMPACTION = ("--auto-compaction-mode=revision", "--auto-compaction-retention=100000")


class EtcdNotFoundError(RuntimeError):
    """The etcd binary is not on PATH (``make setup`` installs it)."""


class EtcdPortInUseError(RuntimeError):
    """A port etcd needs is taken (another etcd, another standalone)."""


class EtcdInUseError(RuntimeError):
    """The data directory belongs to an etcd whose owner still runs."""


@dataclass
class EtcdProcess:
    """``start()`` launches etcd and waits until the member it started answers."""

    client_port: int = 0
    peer_port: int = 0
    data_dir: str | None = None
    host: str = "127.0.0.1"
    startup_timeout: float = 20.0
    extra_args: tuple[str, ...] = ()  # more etcd flags, e.g. ("--auth-token-ttl=2",)
    name: str = ""  # the member's name; default a unique one, kept by restart()
    # Membership of a multi-member cluster (``EtcdCluster`` sets them): etcd's
    # --initial-cluster (NAME=PEER_URL,...; empty: this member alone) and
    # --initial-cluster-token (empty: etcd's default), read only when the member first starts.
    initial_cluster: str = ""
    initial_cluster_token: str = ""
    tls: EtcdServerTLS | None = None  # TLS on the client port (None: plaintext)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    stopped_leftover: int | None = field(default=None, init=False)  # pid of an orphan stopped
    _own_dir: bool = field(default=False, init=False)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def pidfile(self) -> str | None:
        return os.path.join(self.data_dir, PIDFILE) if self.data_dir is not None else None

    @property
    def log_path(self) -> str:
        assert self.data_dir is not None
        return os.path.join(self.data_dir, "etcd.log")

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def gateway(self) -> EtcdGateway:
        """etcd's JSON gateway on this member's client port (TLS when it serves TLS); its
        ``enable_auth(root_password)`` and ``add_user(...)`` set up etcd's auth."""
        return EtcdGateway(self.endpoint, self.tls)

    def uri(self, prefix: str = "aiobk", *, user: str | None = None, password: str = "") -> str:
        """The metadata URI of this etcd: ``etcds://`` trusting its CA when it serves TLS;
        with ``user``, its credentials (percent-encoded) in the URI."""
        scheme, options = ("etcds", self.tls.uri_options()) if self.tls else ("etcd", "")
        who = ""
        if user is not None:
            secret = f":{quote(password, safe='')}" if password else ""
            who = f"{quote(user, safe='')}{secret}@"
        return f"{scheme}://{who}{self.endpoint}/{prefix}{options}"

    def start(self) -> EtcdProcess:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> EtcdProcess:
        """Check the data directory and the ports, then start etcd without waiting for it.
        Call it from the thread that lives as long as etcd should (see the module doc)."""
        binary = shutil.which("etcd")
        if binary is None:
            raise EtcdNotFoundError("etcd is not on PATH; run `make setup` to install etcd-server")
        self.client_port = self.client_port or free_port(self.host)
        self.peer_port = self.peer_port or free_port(self.host)
        self.name = self.name or f"aiobk-{secrets.token_hex(4)}"
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="aiobk-etcd-")
            self._own_dir = True
        os.makedirs(self.data_dir, exist_ok=True)
        self._stop_leftover()
        for role, port in (("client", self.client_port), ("peer", self.peer_port)):
            if port_in_use(self.host, port):
                raise EtcdPortInUseError(
                    f"etcd {role} port {self.host}:{port} is in use "
                    "(another etcd or standalone running?)"
                )
        client = f"{'https' if self.tls else 'http'}://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        with open(self.log_path, "ab") as log_file:
            command = [
                binary,
                f"--name={self.name}",
                f"--data-dir={self._member_dir()}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={self.initial_cluster or f'{self.name}={peer}'}",
                *(
                    [f"--initial-cluster-token={self.initial_cluster_token}"]
                    if self.initial_cluster_token
                    else []
                ),
                "--log-level=error",
                *(self.tls.flags() if self.tls else ()),
                *self.extra_args,
            ]
            # Only the main thread lives as long as the process; etcd tied to another (an
            # executor's worker) would die with it. The pid file covers that case.
            if threading.current_thread() is threading.main_thread():
                command = dying_with_parent(command)
            self.process = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._write_pidfile()
        return self

    def wait_ready(self) -> EtcdProcess:
        """Until the member started here answers on the client port; stops it on failure."""
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + self.startup_timeout
        answered_as: str | None = None
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise self._exit_error()
                name = self._answering_member()
                if name == self.name:
                    return self
                answered_as = name or answered_as
                time.sleep(0.05)
            if answered_as is not None:
                raise EtcdPortInUseError(
                    f"{self.endpoint} answers as etcd member {answered_as!r}, not the "
                    f"{self.name!r} started here: another etcd holds the port"
                )
            last = self._log_tail()
            raise RuntimeError(
                f"etcd did not start within {self.startup_timeout}s; see {self.log_path}"
                + (f": {last[-1].strip()}" if last else "")
            )
        except BaseException:
            self.stop(remove_data=False)
            raise

    def stop(self, remove_data: bool = True) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process is not None:
            self._remove_pidfile(self.process.pid)
        self.process = None
        if remove_data and self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self) -> EtcdProcess:
        """Stop (keeping the data) and start again on the same ports and data directory."""
        self.stop(remove_data=False)
        return self.start()

    def kill(self) -> None:
        """SIGKILL: a crash of this member, no clean step. The data directory stays;
        ``start()`` brings the member back on the same ports with its data."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self.process is not None:
            self._remove_pidfile(self.process.pid)
        self.process = None

    def status(self) -> dict[str, Any] | None:
        """etcd's maintenance status of this member (``member_id``, ``leader``: the id of the
        member it follows, 0 while there is none; ids as decimal strings); None: no answer."""
        try:
            answer = self.gateway.post("/v3/maintenance/status", {})
        except (OSError, ValueError, EtcdGatewayError):  # refused, reset, timed out, not JSON
            return None
        member_id = str(answer.get("header", {}).get("member_id", ""))
        leader = str(answer.get("leader", "0"))
        return {**answer, "member_id": member_id, "leader": leader}

    # ------------------------------------------------------------------ internals

    def _member_dir(self) -> str:
        """Absolute: another etcd's command line is matched against it."""
        assert self.data_dir is not None
        return os.path.abspath(os.path.join(self.data_dir, "member-data"))

    def _answering_member(self) -> str | None:
        """The name of the member answering on the client port (None: no answer yet)."""
        try:
            answer = self.gateway.post("/v3/cluster/member/list", {})
        except (OSError, ValueError, EtcdGatewayError):  # refused, reset, timed out, not JSON yet
            return None
        member_id = str(answer.get("header", {}).get("member_id", ""))
        for member in answer.get("members", []):
            if str(member.get("ID", "")) == member_id:
                return str(member.get("name", "")) or None
        return None

    def _exit_error(self) -> RuntimeError:
        assert self.process is not None
        lines = self._log_tail()
        for line in reversed(lines):
            if "address already in use" in line:
                where = line.split("listen tcp ", 1)[-1].split(": bind", 1)[0]
                return EtcdPortInUseError(f"etcd cannot listen on {where}: address in use")
        return RuntimeError(
            f"etcd exited with {self.process.returncode}; see {self.log_path}"
            + (f": {lines[-1].strip()}" if lines else "")
        )

    def _log_tail(self) -> list[str]:
        """The last lines of this member's log (none when it cannot be read)."""
        with contextlib.suppress(OSError), open(self.log_path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(self.log_path) - 8192))
            return [line for line in handle.read().decode(errors="replace").splitlines() if line]
        return []

    def _write_pidfile(self) -> None:
        assert self.process is not None
        assert self.pidfile is not None
        temporary = self.pidfile + ".tmp"
        with open(temporary, "w") as handle:
            json.dump({"etcd": self.process.pid, "owner": os.getpid()}, handle)
        os.replace(temporary, self.pidfile)

    def _remove_pidfile(self, pid: int) -> None:
        if self.pidfile is None:
            return
        with contextlib.suppress(OSError, ValueError):
            with open(self.pidfile) as handle:
                if json.load(handle).get("etcd") != pid:
                    return  # another etcd's since
            os.remove(self.pidfile)

    def _stop_leftover(self) -> None:
        """An etcd still running on this data directory: stopped if its owner is gone (a
        standalone killed before etcd was tied to it, or one that launched it from another
        thread), refused while its owner runs. Found through the pid file, and on Linux also
        by its command line (an orphan of a version that wrote no pid file)."""
        assert self.pidfile is not None
        owners: dict[int, int | None] = {}  # etcd pid -> its recorded owner
        try:
            with open(self.pidfile) as handle:
                record = json.load(handle)
            owners[int(record["etcd"])] = int(record["owner"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable: the scan below still finds a live etcd
        if os.path.isdir("/proc"):
            owners = {pid: owner for pid, owner in owners.items() if self._runs_here(pid)}
            for pid in pids():
                if pid not in owners and self._runs_here(pid):
                    owners[pid] = None
        elif any(alive(pid) for pid in owners):  # no way to tell it is still that etcd
            raise EtcdInUseError(
                f"an etcd (pid {next(iter(owners))}) may still run on {self.data_dir}: stop "
                f"it, or remove {self.pidfile} if that process is not etcd"
            )
        for pid, owner in owners.items():
            state = proc_state(pid)
            parent = state[1] if state is not None else None
            if parent is not None and parent > 1 and parent == (owner or parent) and alive(parent):
                raise EtcdInUseError(
                    f"{self.data_dir} is in use: its etcd (pid {pid}) belongs to process "
                    f"{parent}, which still runs"
                )
            self._kill_leftover(pid)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.pidfile)

    def _runs_here(self, pid: int) -> bool:
        """Whether ``pid`` is a live etcd on this data directory (a relative --data-dir is
        taken from that process's working directory)."""
        given = [a[len("--data-dir=") :] for a in cmdline(pid) if a.startswith("--data-dir=")]
        if not given or not alive(pid):
            return False
        try:
            path = os.path.join(os.readlink(f"/proc/{pid}/cwd"), given[-1])
        except OSError:
            return False
        return os.path.realpath(path) == os.path.realpath(self._member_dir())

    def _kill_leftover(self, pid: int) -> None:
        log.warning("stopping the etcd (pid %d) an earlier owner left in %s", pid, self.data_dir)
        for signum in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
            if wait_gone(pid, 10.0):
                self.stopped_leftover = pid
                return
        raise EtcdInUseError(f"the leftover etcd (pid {pid}) in {self.data_dir} lives on")


@dataclass
class EtcdCluster:
    """``size`` etcd members forming one cluster, each an ``EtcdProcess`` of its own.

    The members listen on ``hosts`` (one address per member: 127.0.0.2, .3 and .4 play three
    hosts, Linux routing all of 127/8 to loopback) or, without hosts, all on 127.0.0.1 on ports
    of their own. ``start()`` launches every member before waiting for any -- a member of a new
    cluster serves only once a majority has met -- then waits for a leader. Each of
    ``members`` is an ``EtcdProcess`` like any other: ``kill()`` (SIGKILL) or ``stop()`` one,
    and its ``start()`` brings it back into the cluster with its data on the same ports.

    The members share a random ``--initial-cluster-token``, so that a member of another
    cluster can never be taken for one of these. ``uri()`` names every client endpoint.
    """

    size: int = 3
    hosts: tuple[str, ...] = ()  # one per member; empty: every member on 127.0.0.1
    data_dir: str | None = None  # the members' directories go under it; default a temporary one
    startup_timeout: float = 30.0  # for all members to answer and a leader to be elected
    extra_args: tuple[str, ...] = ()  # more etcd flags for every member
    members: list[EtcdProcess] = field(default_factory=list, init=False)
    token: str = field(default="", init=False)
    _own_dir: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"an etcd cluster needs at least one member, not {self.size}")
        if self.hosts and len(self.hosts) != self.size:
            raise ValueError(f"{len(self.hosts)} hosts given for {self.size} members")

    @property
    def endpoints(self) -> list[str]:
        """``host:port`` of every member's client port, in member order."""
        return [member.endpoint for member in self.members]

    @property
    def running(self) -> list[EtcdProcess]:
        return [member for member in self.members if member.running]

    def uri(self, prefix: str = "aiobk", *, first: EtcdProcess | None = None) -> str:
        """``etcd://A,B,C/PREFIX`` naming every member; ``first`` (one of ``members``) leads
        the list: a client talks to the first endpoint until it fails."""
        order = list(self.members)
        if first is not None:
            order.remove(first)
            order.insert(0, first)
        return f"etcd://{','.join(member.endpoint for member in order)}/{prefix}"

    def start(self) -> EtcdCluster:
        """Launch the members not running, wait until each answers as itself and the cluster
        has a leader. On failure every member is stopped."""
        if not self.members:
            self._plan()
        try:
            for member in self.members:
                if not member.running:
                    member.launch()
            for member in self.members:
                member.wait_ready()
            self.wait_leader()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, remove_data: bool = True) -> None:
        for member in self.members:
            member.stop(remove_data=False)
        if remove_data and self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def leader(self) -> EtcdProcess | None:
        """The running member that a running member names as leader and that says so itself;
        None while there is none (an election under way, no majority)."""
        answers = [(m, s) for m in self.running if (s := m.status()) is not None]
        by_id = {status["member_id"]: (m, status) for m, status in answers}
        for _member, status in answers:
            named = by_id.get(status["leader"])
            if named is not None and named[1]["leader"] == status["leader"]:
                return named[0]
        return None

    def wait_leader(self, timeout: float | None = None) -> EtcdProcess:
        """Until the running members have a leader; RuntimeError after ``timeout`` seconds
        (default ``startup_timeout``)."""
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        while True:
            leader = self.leader()
            if leader is not None:
                return leader
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"etcd cluster {','.join(self.endpoints)} elected no leader in time; "
                    f"see the members' etcd.log under {self.data_dir}"
                )
            time.sleep(0.05)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _plan(self) -> None:
        """Ports, names and directories of every member, fixed before any starts: each
        member's --initial-cluster names all of their peer URLs."""
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="aiobk-etcd-cluster-")
            self._own_dir = True
        self.token = f"aiobk-{secrets.token_hex(4)}"
        hosts = self.hosts or ("127.0.0.1",) * self.size
        self.members = [
            EtcdProcess(
                client_port=free_port(host),
                peer_port=free_port(host),
                data_dir=os.path.join(self.data_dir, f"member{index}"),
                host=host,
                startup_timeout=self.startup_timeout,
                extra_args=self.extra_args,
                name=f"{self.token}-{index}",
                initial_cluster_token=self.token,
            )
            for index, host in enumerate(hosts)
        ]
        initial = ",".join(f"{member.name}={member.peer_url}" for member in self.members)
        for member in self.members:
            member.initial_cluster = initial
