"""What the host says about its processes and loopback ports, for the servers this package
starts as children (``etcd_process``; the tests and benchmarks start theirs the same way):
ports free to hand out, processes alive or gone (read from /proc, where a zombie whose threads
still hold its files has not exited yet), and a child that dies with the thread that started it.
"""

from __future__ import annotations

import os
import socket
import sys
import time

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


def dying_with_parent(command: list[str]) -> list[str]:
    """``command`` run so that the kernel kills it when the calling thread dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-I", "-S", "-c", _EXEC_DYING_WITH_PARENT, str(os.getpid()), *command]


def proc_state(pid: int) -> tuple[str, int] | None:
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
    return proc_state(pid) is None


def cmdline(pid: int) -> list[str]:
    """The process's command line (empty once it has exited)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [arg.decode(errors="replace") for arg in handle.read().split(b"\0") if arg]
    except OSError:
        return []


def pids() -> list[int]:
    """Every process id on the host."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def alive(pid: int) -> bool:
    """The process runs (without /proc, a zombie counts as running)."""
    if proc_state(pid) is not None:
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


def wait_gone(pid: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for the process to exit; whether it did."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)
