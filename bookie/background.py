"""The bookie's background work while it serves (checkpoints, the boot-time repair, garbage
collection, the TLS reload): one named task each (``bookie-<name>``), a failure said as soon as
it happens, and all of them cancelled together when the bookie stops or crashes.

The bookie's lifecycle decides what runs; this part owns the tasks, so that a stop cannot
leave one behind and a failed one cannot cut a stop short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """The tasks a running bookie keeps beside serving, by name."""

    def __init__(self, owner: Callable[[], str]) -> None:
        """``owner``: the bookie's id, for the log lines."""
        self._owner = owner
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def spawn(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as the task ``bookie-<name>``."""
        task = asyncio.get_running_loop().create_task(work, name=f"bookie-{name}")
        task.add_done_callback(self._ended)
        self._tasks[name] = task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A background task that fails is said at once, not only when the bookie stops."""
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "bookie %s: %s failed", self._owner(), task.get_name(), exc_info=task.exception()
            )

    def running(self, name: str) -> bool:
        """Whether the task ``name`` exists and has not ended."""
        task = self._tasks.get(name)
        return task is not None and not task.done()

    async def wait(self, name: str) -> None:
        """Until the task ``name`` (if any) has ended; cancelling the wait leaves it running."""
        task = self._tasks.get(name)
        if task is not None:
            await asyncio.shield(task)

    async def cancel_all(self) -> None:
        """Cancel every task and wait for each to end."""
        tasks, self._tasks = self._tasks, {}
        for task in tasks.values():
            task.cancel()
        for task in tasks.values():
            # One that failed earlier (said then, ``_ended``) must not stop the rest of a stop
            # or crash: the journal would be left undrained and running.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


__all__ = ["Background"]
