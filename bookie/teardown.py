"""The steps of a bookie's stop, each run although an earlier one failed.

A bookie that cannot leave the registry (the metadata service is unreachable) or close its
index (a failed disk) must still let go of its port, its connections, its files and its
threads: a stop that gave up at the first failure would leave a half-stopped bookie serving
in the process. Every step runs; the first failure is raised once the last has run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Teardown:
    """Runs a stop's steps in order, keeping the first failure for ``raise_first``."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self.failure: Exception | None = None

    async def run(self, step: Callable[..., Awaitable[object]], *args: object) -> bool:
        """Run ``step(*args)``; whether it succeeded. A failure is logged and kept; a
        cancellation is not a failure of the step and ends the stop at once."""
        try:
            await step(*args)
        except Exception as exc:
            name = getattr(step, "__qualname__", repr(step))
            log.warning("%s: %s failed while stopping: %s", self._owner, name, exc)
            if self.failure is None:
                self.failure = exc
            return False
        return True

    def raise_first(self) -> None:
        """Raise the first failure, if a step failed."""
        if self.failure is not None:
            raise self.failure


__all__ = ["Teardown"]
