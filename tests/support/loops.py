"""The tests' event loop: uvloop, closed so that a test which leaves a server or a connection
open fails with a clear error instead of hanging.

The suite turns warnings into errors. uvloop's ``close()`` warns (``ResourceWarning``) about
each handle still open and then closes it; raised as an error, the warning ends uvloop's walk
over the handles before it closes them, and ``close()`` then waits forever for the handles it
never closed. Here the warnings are recorded while the loop closes, every handle is closed, and
what was left open is raised after.
"""

from __future__ import annotations

import warnings

import uvloop


class LeakCheckingLoop(uvloop.Loop):
    def close(self) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            super().close()
        left = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        if left:
            raise AssertionError(f"the test left open at its end: {'; '.join(left)}")


def new_event_loop() -> LeakCheckingLoop:
    return LeakCheckingLoop()
