"""A lane: one long-lived thread that runs a file's blocking calls off the event loop, one after
another, in the order they were handed over.

A bookie writes its journal and its entry logs on lanes (``OsDisk``). Under load a group
commit hands a write and an ``fdatasync`` to its lane hundreds of times a second, and a
``ThreadPoolExecutor``'s hand-off -- a ``concurrent.futures.Future`` with its condition
variable, the pool's locks and idle semaphore, and the asyncio future chained to it -- took
about a tenth of a loaded bookie's event-loop time. A lane's call is an asyncio future, an entry
in a ``SimpleQueue`` and one thread-safe callback back to the loop.

Unlike an executor's, a call handed over always runs, also when its caller is cancelled first:
a write the file's size already counts lands where it was counted. A lane's queue holds a
handful of calls at most: each of its callers (the journal's writer and sync stage, an entry
log's flush) awaits one call before it hands over the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class LaneClosedError(RuntimeError):
    """A call handed to a lane after ``close``."""


class Lane:
    """One thread running the calls handed to it in order (see the module docstring).

    Args:
        name: The thread's name, after ``aiobk-``.
    """

    __slots__ = ("_closed", "_queue", "_started", "_thread", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        # A daemon: a process that exits without closing its disk is not held up by an idle
        # lane (an executor's atexit join would wait); a bookie's stop closes every lane.
        self._thread = threading.Thread(target=self._work, name=f"aiobk-{name}", daemon=True)
        self._started = False  # the thread starts with the first call
        self._closed = False

    def run(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``function(*args)`` on the lane's thread, after every call handed over before it;
        its result or exception comes back through the returned future. Called on the event
        loop's thread, as ``close`` is."""
        if self._closed:
            raise LaneClosedError(f"lane {self.name} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if not self._started:
            self._started = True
            self._thread.start()
        self._queue.put((loop, future, function, args))
        return future

    def close(self) -> None:
        """Run what was handed over, then stop the thread (blocking until it has)."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            self._queue.put(None)
            self._thread.join()

    def _work(self) -> None:
        get = self._queue.get
        while True:
            call = get()
            if call is None:
                return
            loop, future, function, args = call
            error: BaseException | None = None
            result: Any = None
            try:
                result = function(*args)
            except BaseException as exc:  # the caller's, as from an executor
                error = exc
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
                loop.call_soon_threadsafe(_settle, future, result, error)
            del call, loop, future, function, args, result, error  # none held while it waits


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


__all__ = ["Lane", "LaneClosedError"]
