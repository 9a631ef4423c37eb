"""The simulator's event loop: async-solipsism's virtual-time loop (time jumps to the next timer;
a wait with nothing scheduled raises SleepForeverError) plus a spin detector: code that keeps
the loop busy while virtual time stands still -- a retry loop that never sleeps -- would burn a
CPU in production, and here would never end. Past ``SPIN_LIMIT`` loop iterations at one instant
the run fails with ``SpinError``.
"""

from __future__ import annotations

import async_solipsism

SPIN_LIMIT = 200_000


class SpinError(RuntimeError):
    pass


class SimLoop(async_solipsism.EventLoop):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self._spin_at = -1.0
        self._spins = 0

    def _run_once(self) -> None:
        now = self.time()
        if now == self._spin_at:
            self._spins += 1
            if self._spins > SPIN_LIMIT:
                ready = [repr(handle)[:200] for handle in list(self._ready)[:3]]
                raise SpinError(f"busy loop at t={now:.6f}: virtual time stands still; {ready}")
        else:
            self._spin_at = now
            self._spins = 0
        super()._run_once()
