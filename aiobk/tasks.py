"""``TaskKeeper``: the tasks a component has started and not seen end, in the order it started
them.

Bookies, clients and the auditor start tasks they must be able to cancel later (a connection's
handlers when it goes away, a writer's sends when it closes). A task is kept until it ends and
dropped then. The keeper is an insertion-ordered dict, never a set: a set of tasks iterates by
memory address, which differs between two runs of one simulator seed, and cancelling in that
order once made a seed replay differently (``tests/sim/run.py`` states the rule). No I/O here:
the tasks are the caller's. The lowest layer (pyproject.toml), below the codec, which knows no
asyncio: every layer above may keep tasks with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Task[Any], *ignored: type[BaseException]) -> None:
    """Cancel ``task`` and wait until it has ended. Its cancellation is expected; an exception
    of ``ignored`` types is swallowed, any other is raised. A cancellation of the caller while it
    waits reaches the caller: it is not taken for the task's own end."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except ignored:
        pass


async def cancel_all(tasks: Collection[asyncio.Future[Any]]) -> None:
    """Cancel every one of ``tasks`` and wait until all have ended, their outcomes (a
    cancellation, an error) dropped: what a reader does with the reads it no longer needs."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


class TaskKeeper:
    """Tasks started through ``spawn`` (or handed to ``keep``) until each ends."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[Any], None] = {}

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Start ``coro`` as a task on the running loop and keep it until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.keep(task)
        return task

    def keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks[task] = None
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        """The tasks kept now, oldest first (a copy: cancelling while walking is safe)."""
        return iter(list(self._tasks))

    def cancel(self) -> None:
        """Ask every task kept to stop (it ends, and is dropped, on a later loop turn)."""
        for task in list(self._tasks):
            task.cancel()

    async def cancel_and_wait(self, *ignored: type[BaseException]) -> None:
        """Cancel every task kept and wait until each has ended. A task's cancellation is
        expected; an exception of ``ignored`` types is swallowed, any other is raised."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        # asyncio.wait, not ``await task`` under a suppressed CancelledError: a cancellation of
        # the caller while it waits must reach the caller, not be taken for a task's own end.
        await asyncio.wait(tasks)
        for task in tasks:
            if task.cancelled():
                continue
            error = task.exception()
            if error is not None and not isinstance(error, ignored):
                raise error
