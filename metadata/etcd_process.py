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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

PIDFILE = "etcd.pid"
# Loopback requests must not go through an http_proxy from the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# etcd's own bound on its history: revision-mode auto-compaction keeping this many revisions
# (what `aiobk standalone` runs with; the bookies' GC passes compact too).
AUTO_COMPACTION = ("--auto-compaction-mode=revision", "--auto-compaction-retention=100000")


class EtcdNotFoundError(RuntimeError):
    """The etcd binary is not on PATH (``make setup`` installs it)."""


class EtcdPortInUseError(RuntimeError):
    """A port etcd needs is taken (another etcd, another standalone)."""


class EtcdInUseError(RuntimeError):
    """The data directory belongs to an etcd whose owner still runs."""


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, and that this process has not handed out before: the
    kernel may offer a just-released port again, and two bookies given one port would start
    as one identity (seen: the second refused at its cookie)."""
    for _attempt in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no fresh loopback port after 100 tries")


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on (or holds) ``host:port``. SO_REUSEADDR as servers set it:
    a port in TIME_WAIT counts as free, a listener (also on 0.0.0.0) as taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


# Run first in the child, a fresh single-threaded interpreter (a preexec_fn would run Python
# in a fork of a threaded process): arm the parent-death signal, then become etcd. The signal
# survives the exec; it fires when the thread that forked the child dies.
_EXEC_DYING_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the parent died before the signal was armed
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _dying_with_parent(command: list[str]) -> list[str]:
    """``command`` run so that the kernel kills it when the calling thread dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-I", "-S", "-c", _EXEC_DYING_WITH_PARENT, str(os.getpid()), *command]


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a live process from /proc; None once it has exited.

    A zombie has exited only when it is alone in its thread group: etcd's leader thread can be
    a zombie while its other threads still exit, holding the process's files (its ports)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or (fields[0] in ("Z", "X") and threads <= 1):
        return None
    return fields[0], int(fields[1])


def exited(pid: int) -> bool:
    """The process is gone (or a zombie with no thread left holding its files)."""
    return _proc_state(pid) is None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [arg.decode(errors="replace") for arg in handle.read().split(b"\0") if arg]
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _alive(pid: int) -> bool:
    if _proc_state(pid) is not None:
        return True
    if os.path.isdir("/proc"):
        return False
    try:  # no /proc: the signal-0 probe (a zombie counts as alive here)
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


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

    def uri(self, prefix: str = "aiobk") -> str:
        return f"etcd://{self.endpoint}/{prefix}"

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
        client = f"http://{self.host}:{self.client_port}"
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
                f"--initial-cluster={self.name}={peer}",
                "--log-level=error",
                *self.extra_args,
            ]
            # Only the main thread lives as long as the process; etcd tied to another (an
            # executor's worker) would die with it. The pid file covers that case.
            if threading.current_thread() is threading.main_thread():
                command = _dying_with_parent(command)
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
            raise RuntimeError(
                f"etcd did not start within {self.startup_timeout}s; see {self.log_path}"
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

    # ------------------------------------------------------------------ internals

    def _member_dir(self) -> str:
        """Absolute: another etcd's command line is matched against it."""
        assert self.data_dir is not None
        return os.path.abspath(os.path.join(self.data_dir, "member-data"))

    def _answering_member(self) -> str | None:
        """The name of the member answering on the client port (None: no answer yet)."""
        request = urllib.request.Request(
            f"http://{self.endpoint}/v3/cluster/member/list", data=b"{}", method="POST"
        )
        try:
            with _NO_PROXY.open(request, timeout=1.0) as response:
                answer = json.loads(response.read())
        except (OSError, ValueError):  # refused, reset, timed out, not JSON yet
            return None
        member_id = str(answer.get("header", {}).get("member_id", ""))
        for member in answer.get("members", []):
            if str(member.get("ID", "")) == member_id:
                return str(member.get("name", "")) or None
        return None

    def _exit_error(self) -> RuntimeError:
        assert self.process is not None
        lines = []
        with contextlib.suppress(OSError), open(self.log_path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(self.log_path) - 8192))
            lines = handle.read().decode(errors="replace").splitlines()
        for line in reversed(lines):
            if "address already in use" in line:
                where = line.split("listen tcp ", 1)[-1].split(": bind", 1)[0]
                return EtcdPortInUseError(f"etcd cannot listen on {where}: address in use")
        return RuntimeError(
            f"etcd exited with {self.process.returncode}; see {self.log_path}"
            + (f": {lines[-1].strip()}" if lines else "")
        )

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
            for pid in _pids():
                if pid not in owners and self._runs_here(pid):
                    owners[pid] = None
        elif any(_alive(pid) for pid in owners):  # no way to tell it is still that etcd
            raise EtcdInUseError(
                f"an etcd (pid {next(iter(owners))}) may still run on {self.data_dir}: stop "
                f"it, or remove {self.pidfile} if that process is not etcd"
            )
        for pid, owner in owners.items():
            state = _proc_state(pid)
            parent = state[1] if state is not None else None
            if parent is not None and parent > 1 and parent == (owner or parent) and _alive(parent):
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
        given = [a[len("--data-dir=") :] for a in _cmdline(pid) if a.startswith("--data-dir=")]
        if not given or not _alive(pid):
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
            if _wait_gone(pid, 10.0):
                self.stopped_leftover = pid
                return
        raise EtcdInUseError(f"the leftover etcd (pid {pid}) in {self.data_dir} lives on")
