"""``aiobk.runner.tune_malloc``: a bookie process keeps the memory it frees for reuse instead of
giving it back and faulting it in again, and the environment's own settings win."""

from __future__ import annotations

import os
import subprocess
import sys

# Allocation churn shaped like a bookie's under load: a few MiB of batch buffers of 1 MiB and
# many small objects, freed again, round after round. Untuned, glibc slides its mmap threshold up
# to the 1 MiB freed and its trim threshold to twice that, so each round's 8 MiB is given back
# and faulted in again (measured: ~100,000 faults); tuned, it stays in the heap (~2,000). An
# earlier churn of ~1.2 MiB a round sat on the sliding trim threshold and faulted 264 times on
# one machine and 510 on another: the margin must not hang on where the threshold slides to.
CHURN = """
import os, resource, sys
from aiobk.runner import tune_malloc
tuned = tune_malloc() if sys.argv[1] == "tune" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    frames = [bytearray(1 << 20) for _ in range(8)]
    records = [bytes(1000) for _ in range(300)]
    del frames, records
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _run(mode: str, **env: str) -> tuple[str, int]:
    run = subprocess.run(
        [sys.executable, "-c", CHURN, mode],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    tuned, faults = run.stdout.split()
    return tuned, int(faults)


def test_tuned_malloc_faults_far_less_under_churn() -> None:
    _none, plain = _run("plain")
    tuned, faults = _run("tune")
    assert tuned == "True"  # the arena cap was set
    assert faults * 10 < plain, (faults, plain)  # measured: 1,947 against 100,771


def test_the_environment_wins() -> None:
    tuned, _faults = _run("tune", MALLOC_ARENA_MAX="4")
    assert tuned == "False"  # the operator's arena cap stands
    # With glibc's own thresholds given, they stand: the churn faults as much as untuned.
    _none, plain = _run("plain")
    _tuned, faults = _run("tune", MALLOC_TRIM_THRESHOLD_="131072", MALLOC_MMAP_THRESHOLD_="131072")
    assert faults * 2 > plain, (faults, plain)
