"""``python -m tests.soak.bookie start ...``: the bookie (``python -m aiobk.bookie``), in the same
process, once the kernel is told to SIGKILL it when the soak's harness dies (Linux's
parent-death signal, as aiobk.metadata.etcd_process arms it for etcd): an interrupted hour-long
soak leaves no bookie behind. The harness starts bookies from its main thread, which lives as
long as it does."""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

PR_SET_PDEATHSIG = 1

if __name__ == "__main__":
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the harness died before the signal was armed
        sys.exit(1)
    runpy.run_module("aiobk.bookie", run_name="__main__", alter_sys=True)
